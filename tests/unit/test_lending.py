"""lend_idle_cores: what a pinned instance borrows, the thread affinities it asks of ONNX Runtime, the board instances
share, and which engine a batch runs on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gebackend.config.options import BackendOptions, ConfigError, parse_options
from gebackend.engines.onnxruntime import session_options
from gebackend.runtime.lending import BusyBoard, Lending, LendingRunner, lending_options, plan_lending, why_not_lent
from gebackend.runtime.pinning import plan_cpus


def test_two_instances_on_two_cores_borrow_each_others_core():
    first, why = plan_lending(plan_cpus(0, 2, (0, 1)), 0)
    assert why == "" and (first.own, first.lent, first.threads, first.affinities()) == ((0,), (1,), 2, "2")
    second, _ = plan_lending(plan_cpus(1, 2, (0, 1)), 0)
    assert (second.own, second.lent, second.affinities()) == ((1,), (0,), "1")


def test_what_is_borrowed_is_the_other_instances_planned_cores():
    lending, _ = plan_lending(plan_cpus(0, 2, (0, 1, 2, 3)), 0)  # 2 cores each
    assert (lending.own, lending.lent, lending.threads) == ((0, 1), (2, 3), 4)
    assert lending.affinities() == "2;3;4"  # the calling thread stays on core 0: workers on 1, 2 and 3
    lending, _ = plan_lending(plan_cpus(1, 2, (0, 1, 2, 3), 1), 1)  # cores_per_instance=1: cores 2-3 are no one's
    assert (lending.own, lending.lent) == ((1,), (0,))
    lending, _ = plan_lending(plan_cpus(2, 3, (0, 1, 2)), 0)
    assert (lending.own, lending.lent, lending.affinities()) == ((2,), (0, 1), "1;2")


def test_nothing_is_lent_where_no_core_is_an_idle_siblings():
    assert plan_lending(plan_cpus(0, 1, (0, 1)), 0)[0] is None  # one instance
    lending, why = plan_lending(None, 0)  # not pinned
    assert lending is None and why.startswith("only pinned instances lend")
    lending, why = plan_lending(plan_cpus(0, 3, (0, 1)), 0)
    assert lending is None and "share cores" in why
    moved = replace(plan_cpus(0, 2, (0, 1, 2, 3)), cpus=(2, 3))  # the core ledger put it beside another model
    lending, why = plan_lending(moved, 0)
    assert lending is None and "not its planned 0-1" in why


def test_the_engine_is_lent_only_for_onnxruntimes_dynamic_graph_on_the_cpu(tmp_path):
    options = BackendOptions()
    assert why_not_lent(options, "onnxruntime", "cpu", False, tmp_path) == ""
    assert "CPU provider only" in why_not_lent(options, "openvino", "cpu", False, tmp_path)
    assert "CPU provider only" in why_not_lent(options, "onnxruntime", "cuda", False, tmp_path)
    assert "dynamic graph only" in why_not_lent(options, "onnxruntime", "cpu", True, tmp_path)
    assert "gebackend serve" in why_not_lent(options, "onnxruntime", "cpu", False, None)
    mine = options.replace(intra_op_thread_affinities="2")
    assert "intra_op_thread_affinities is set" in why_not_lent(mine, "onnxruntime", "cpu", False, tmp_path)


def test_the_lent_engine_threads_reach_the_borrowed_cores_and_stop_spinning_at_the_end_of_a_run():
    lent = lending_options(BackendOptions.make(intra_op_thread_count=1), Lending(0, 2, (0,), (1,)))
    s = lent.session
    assert (s.intra_op_thread_count, s.intra_op_thread_affinities, s.allow_spinning, s.force_spinning_stop) == (2, "2", "on", "on")
    so = session_options(s)
    assert so.intra_op_num_threads == 2
    assert so.get_session_config_entry("session.intra_op_thread_affinities") == "2"
    assert so.get_session_config_entry("session.force_spinning_stop") == "1"
    with pytest.raises(RuntimeError, match="does not have configuration"):  # nothing placed unless asked
        session_options(BackendOptions().session).get_session_config_entry("session.intra_op_thread_affinities")


@pytest.mark.parametrize("text, expected", [("2", "2"), (" 2;3 ", "2;3"), ("2,3;4-5", "2,3;4-5"), ("", "")])
def test_thread_affinities_parse(text, expected):
    parsed = parse_options("m", {}, {"intra_op_thread_affinities": text})
    assert parsed.options.session.intra_op_thread_affinities == expected


@pytest.mark.parametrize("text", ["0", "a", "2;;3", "3-2", "1,"])
def test_thread_affinities_refused(text):
    with pytest.raises(ConfigError, match="intra_op_thread_affinities=.*logical processors counted from 1"):
        parse_options("m", {}, {"intra_op_thread_affinities": text})


@pytest.mark.parametrize("text, expected", [("on", "on"), ("true", "on"), ("1", "on"), ("off", "off"), ("0", "off")])
def test_lend_idle_cores_is_on_or_off(text, expected):
    assert BackendOptions().instances.lend_idle_cores == "off"
    assert parse_options("m", {}, {"lend_idle_cores": text}).options.instances.lend_idle_cores == expected
    with pytest.raises(ConfigError, match="lend_idle_cores"):
        parse_options("m", {}, {"lend_idle_cores": "auto"})


def test_the_board_shows_each_instance_the_others(tmp_path):
    first, second = BusyBoard(tmp_path, "m/odel", 0, 2), BusyBoard(tmp_path, "m/odel", 1, 2)
    other_model = BusyBoard(tmp_path, "other", 1, 2)
    assert not first.others_busy() and not second.others_busy()
    second.mark(True)
    assert first.others_busy() and not second.others_busy() and not other_model.others_busy()
    second.mark(False)
    assert not first.others_busy()
    second.mark(True)
    BusyBoard(tmp_path, "m/odel", 1, 2)  # a restarted instance 1 is idle, whatever the one before left
    assert not first.others_busy()
    with pytest.raises(ValueError):
        BusyBoard(tmp_path, "m", 2, 2)
    for board in (first, second, other_model):
        board.close()


class _Runner:
    def __init__(self, name):
        self.name, self.closed = name, False

    def run(self, feeds):
        return {"y": np.array([self.name])}

    def engines(self):
        return [self.name]

    def close(self):
        self.closed = True


def test_a_batch_runs_on_the_borrowed_cores_only_while_the_siblings_idle(tmp_path):
    board, sibling = BusyBoard(tmp_path, "m", 0, 2), BusyBoard(tmp_path, "m", 1, 2)
    runner = LendingRunner(_Runner("own"), _Runner("lent"), board)
    assert runner.run({})["y"][0] == "lent"
    assert not sibling.others_busy()  # the runner's mark is cleared when the run returns
    sibling.mark(True)
    assert runner.run({})["y"][0] == "own"
    sibling.mark(False)
    assert runner.run({})["y"][0] == "lent"
    assert (runner.lent_runs, runner.own_runs, runner.engines()) == (2, 1, ["own", "lent"])
    runner.close()
    assert runner.own.closed and runner.lent.closed


def _add_mul_spec(tmp_path, **options):
    import onnx

    from gebackend.config.onnx_signature import signature_of
    from gebackend.config.spec import build_model_spec
    from gebackend.modelzoo import build_add_mul

    model, path = build_add_mul(), tmp_path / "model.onnx"
    onnx.save(model, path)
    return build_model_spec({"name": "add_mul", "max_batch_size": 8}, signature_of(model), path,
                            BackendOptions.make(lend_idle_cores="on", **options))


def test_the_loader_puts_a_lending_runner_where_the_engine_can_lend(tmp_path, monkeypatch):
    from gebackend.runtime.loader import load_executor

    monkeypatch.setenv("GE_CONTROL_DIR", str(tmp_path / "control"))
    said = []
    executor, how = load_executor(_add_mul_spec(tmp_path, intra_op_thread_count=1), log=said.append,
                                  lending=Lending(0, 2, (0,), (1,)))
    assert isinstance(executor.runner, LendingRunner) and len(executor.runner.engines()) == 2 and not said
    assert how.endswith("lend_idle_cores: a batch runs on CPU(s) 0-1 (2 threads) while the model's other instances "
                        "are idle, else on CPU(s) 0")
    assert "intra_op_thread_affinities=2" in executor.runner.lent.engine.describe()
    x, y = np.ones((2, 4), np.float32), np.full((2, 4), 3, np.float32)
    out = executor.execute([{"x": x, "y": y}])[0]
    np.testing.assert_allclose(out["sum"], x + y)
    np.testing.assert_allclose(out["product"], x * y)
    assert executor.runner.lent_runs == 1  # instance 1 never ran: its byte is 0
    executor.runner.close()


def test_the_loader_lends_nothing_without_the_servers_folder_or_on_a_static_graph(tmp_path, monkeypatch):
    from gebackend.runtime.loader import load_executor
    from gebackend.runtime.runners import DynamicRunner

    monkeypatch.delenv("GE_CONTROL_DIR", raising=False)
    said = []
    executor, how = load_executor(_add_mul_spec(tmp_path), log=said.append, lending=Lending(0, 2, (0,), (1,)))
    assert isinstance(executor.runner, DynamicRunner) and "lend_idle_cores" not in how
    assert said == ["lend_idle_cores=on: lends nothing: the instances' shared board lives in the folder of "
                    "`gebackend serve`, which did not start this server"]
    monkeypatch.setenv("GE_CONTROL_DIR", str(tmp_path / "not-a-folder"))
    (tmp_path / "not-a-folder").write_text("")  # the board cannot be made in it
    said.clear()
    executor, _ = load_executor(_add_mul_spec(tmp_path), log=said.append, lending=Lending(0, 2, (0,), (1,)))
    assert isinstance(executor.runner, DynamicRunner) and said[0].startswith(
        "lend_idle_cores=on: lends nothing: the instances' board cannot be made: ")


def test_an_engine_that_cannot_take_the_borrowed_cores_leaves_the_model_loading_without_them(tmp_path, monkeypatch):
    from gebackend.errors import ModelLoadError
    from gebackend.runtime import loader
    from gebackend.runtime.runners import DynamicRunner

    made = []

    def create(spec, providers):
        if spec.options.session.intra_op_thread_affinities:
            raise ModelLoadError("ONNX Runtime cannot load model.onnx: affinity refused")
        made.append(spec)
        return original(spec, providers)

    original = loader.create_engine
    monkeypatch.setattr(loader, "create_engine", create)
    monkeypatch.setenv("GE_CONTROL_DIR", str(tmp_path / "control"))
    said = []
    executor, how = loader.load_executor(_add_mul_spec(tmp_path), log=said.append, lending=Lending(0, 2, (0,), (1,)))
    assert isinstance(executor.runner, DynamicRunner) and "lend_idle_cores" not in how and len(made) == 1
    assert said == ["lend_idle_cores=on: lends nothing: the engine on the borrowed cores did not load: ONNX Runtime "
                    "cannot load model.onnx: affinity refused"]
    out = executor.execute([{"x": np.ones((1, 4), np.float32), "y": np.ones((1, 4), np.float32)}])[0]
    np.testing.assert_allclose(out["sum"], 2.0)
