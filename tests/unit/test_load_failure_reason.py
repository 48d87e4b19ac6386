"""Unit tests for `gebackend serve`'s failed-model line (server/repository_client.py failure_reason): Triton's reason, or for a
config.pbtxt that does not parse, the file, line, column and the parser's complaint."""

from __future__ import annotations

from gebackend.server.repository_client import failure_reason


def _model(repo, name, config):
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name / "config.pbtxt"


def test_empty_reason_from_triton_is_filled_from_the_file(tmp_path):
    path = _model(tmp_path, "badcfg", 'backend: "ge"\nmax_batch_size: "eight"\n')
    reason = failure_reason(tmp_path, {"name": "badcfg"})  # what Triton's index gives for it: no state, no reason
    assert reason == f"cannot parse {path}:2:17: 'max_batch_size: \"eight\"': Couldn't parse integer: \"eight\""


def test_text_proto_reason_is_replaced(tmp_path):
    path = _model(tmp_path, "m", "backend: \"ge\"\ninstance_group [ { kind: KIND_TPU } ]\n")
    reason = failure_reason(tmp_path, {"name": "m", "state": "UNAVAILABLE",
                                       "reason": f"failed to read text proto from {path}"})
    assert reason.startswith(f"cannot parse {path}:2:26: ")


def test_triton_reason_is_kept_when_the_file_parses(tmp_path):
    _model(tmp_path, "contradicts", 'backend: "ge"\n')
    entry = {"name": "contradicts", "state": "UNAVAILABLE",
             "reason": "Internal: ValueError: model 'contradicts': bad dims\n\nAt:\n  bridge.py(49): auto_complete\n"}
    assert failure_reason(tmp_path, entry) == "Internal: ValueError: model 'contradicts': bad dims"


def test_no_reason_at_all_says_so(tmp_path):
    _model(tmp_path, "m", 'backend: "ge"\n')
    assert failure_reason(tmp_path, {"name": "m", "state": "UNAVAILABLE"}) == (
        "tritonserver gave no reason (state UNAVAILABLE; see its log above)")
    assert failure_reason(tmp_path, {"name": "gone"}) == "tritonserver gave no reason (state UNKNOWN; see its log above)"
