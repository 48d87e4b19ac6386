"""Conformance: every ONNX operator test case (and every model case the onnx wheel ships) the plain engine passes also
passes through gebackend, in both graph modes.

One test per engine walks the whole corpus (see `corpus.py`) and reports every mismatch at once; the plain
engines' results are computed in the same run (once per process, shared by the tests), so what "plain passes"
means follows the machine (CPU features, engine versions). The runs are split over two spawned processes: about
2.5 minutes for both engines on an idle 2-core machine; in a whole test run they start with it, at the lowest CPU
priority, and these tests run last (conftest.py). `python -m tests.conformance.report` prints the same numbers and
every exception.
"""

from __future__ import annotations

import importlib.util

import pytest

from . import corpus, model_cases, report

pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def results():
    return corpus.run_all()


def _report(rows) -> str:
    return "\n".join(f"  {name} [{mode}]: {why}" for name, mode, why in rows)


@pytest.mark.parametrize("engine", corpus.ENGINES)
def test_what_the_plain_engine_passes_passes_in_both_graph_modes(results, engine):
    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} is not installed")
    result = report.summary(results, engine)
    counts = result["counts"]
    print(f"{engine}: {counts}")
    assert counts["cases"] > 1000, counts  # the corpus was found
    if (model_cases.data_root() / "light").is_dir():  # and the wheel's model cases with it
        assert sum(name.startswith("light/") for name in results) == 9, sorted(results)[-20:]
    assert counts["passed plain"] > counts["run"] // 2, counts
    assert not result["crashes"], "a dependency's exception reached the caller:\n" + _report(result["crashes"])
    assert not result["regressions"], (f"{len(result['regressions'])} case(s) the plain {engine} passes fail through "
                                       f"gebackend:\n" + _report(result["regressions"]))


def test_only_unservable_cases_are_skipped(results):
    kinds = {report.skip_kind(row["skip"]) for row in results.values() if "skip" in row}
    assert kinds <= {
        "sequence/optional/map input or output (only tensors can be served)",
        "element type with no Triton equivalent (float8, float4, int4/uint4, int2/uint2)",
    }, kinds
