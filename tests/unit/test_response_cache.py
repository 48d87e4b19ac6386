"""server/response_cache.py: `gebackend serve` names the models that enable Triton's response cache when tritonserver
is given no cache, and says how to give it one."""

from __future__ import annotations

from gebackend.server.response_cache import asking_models, cache_note


def _model(repo, name: str, text: str) -> None:
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(text)


def test_models_asking_for_the_cache_are_named_until_a_cache_is_given(tmp_path):
    _model(tmp_path, "cached", 'backend: "ge"\nresponse_cache { enable: true }\n')
    _model(tmp_path, "plain", 'backend: "ge"\n')
    _model(tmp_path, "off", 'backend: "ge"\nresponse_cache { enable: false }\n')
    _model(tmp_path, "broken", 'backend: "ge"\nresponse_cache { enable: maybe }\n')
    assert asking_models(tmp_path) == ["cached"]
    note = cache_note(tmp_path, [])
    assert note == (f"model(s) ['cached'] enable response_cache but tritonserver has no cache, so Triton serves them "
                    f"uncached: start with `gebackend serve {tmp_path} -- --cache-config local,size=BYTES`")
    assert cache_note(tmp_path, ["--cache-config", "local,size=1048576"]) is None
    assert cache_note(tmp_path, ["--cache-config=local,size=1048576"]) is None
    (tmp_path / "cached" / "config.pbtxt").write_text('backend: "ge"\n')
    assert cache_note(tmp_path, []) is None


def test_a_missing_repository_is_left_for_the_server_to_report(tmp_path):
    assert asking_models(tmp_path / "nope") == [] and cache_note(tmp_path / "nope", []) is None
