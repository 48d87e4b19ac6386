"""What this CPU can run (cpu.py; engines/registry.py `precision_run`), checked against the CPUs we meet: AVX-512/BF16/AMX
Intel and AVX2-only AMD."""

from __future__ import annotations

import pytest

from gebackend import cpu
from gebackend.engines.registry import precision_run

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8
"""
AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma bmi2
"""


@pytest.fixture
def fake_cpu(monkeypatch):
    def use(text: str) -> None:
        monkeypatch.setattr(cpu, "_cpuinfo", lambda: text)
        cpu.flags.cache_clear()
        cpu.model_name.cache_clear()

    yield use
    cpu.flags.cache_clear()
    cpu.model_name.cache_clear()


def test_flags_and_description_name_the_cpu_and_what_it_has(fake_cpu):
    fake_cpu(INTEL)
    assert {"avx512_bf16", "amx_int8"} <= cpu.flags()
    assert cpu.describe() == ("Intel(R) Xeon(R) Platinum 8480+ [avx2 fma avx512f avx512bw avx512vl avx512_vnni avx_vnni "
                              "avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8]")
    fake_cpu(AMD)
    assert "avx512f" not in cpu.flags()
    assert cpu.describe() == "AMD EPYC 7B13 [avx2 fma]"


def test_int8_without_vnni_says_it_runs_on_avx2_kernels(fake_cpu):
    fake_cpu(AMD)
    run = precision_run("int8", "onnxruntime")
    assert run.ran == "int8" and "this CPU has no VNNI" in run.note
    fake_cpu(INTEL)
    assert precision_run("int8", "onnxruntime").note == ""
    assert precision_run("origin", "onnxruntime") == cpu.PrecisionRun("origin", "f32", "")


def test_openvino_bf16_and_fp16_on_an_avx2_only_cpu_say_they_ran_f32(monkeypatch):
    pytest.importorskip("openvino")
    from gebackend.engines import openvino as ov_engine

    monkeypatch.setattr(ov_engine, "openvino_capabilities", lambda: ("FP32", "INT8"))  # what OpenVINO reports on AVX2-only
    assert precision_run("bf16", "openvino") == cpu.PrecisionRun(
        "bf16", "f32", "bf16 requested, this CPU has no BF16: ran f32")
    assert precision_run("fp16", "openvino") == cpu.PrecisionRun(
        "fp16", "f32", "fp16 requested, this CPU has no FP16: ran f32")
    assert precision_run("bf16", "openvino").describe() == "bf16 requested, this CPU has no BF16: ran f32"


def test_the_openvino_load_line_says_what_ran_on_an_avx2_only_cpu(monkeypatch, tmp_path):
    pytest.importorskip("openvino")
    import onnx

    from gebackend.config.options import BackendOptions
    from gebackend.engines import openvino as ov_engine
    from gebackend.modelzoo import build_add_mul

    monkeypatch.setattr(ov_engine, "openvino_capabilities", lambda: ("FP32", "INT8"))
    path = tmp_path / "model.onnx"
    onnx.save(build_add_mul(), str(path))
    engine = ov_engine.OvEngine(path, BackendOptions.make(engine="openvino", precision_mode="bf16"))
    try:
        line = engine.describe()
    finally:
        engine.close()
    assert "precision=f32 (precision_mode=bf16; bf16 requested, this CPU has no BF16: ran f32)" in line, line


def test_this_machine_is_described_with_its_real_flags():
    """Whatever this CPU is, the description lists only flags /proc/cpuinfo has."""
    listed = cpu.describe().rsplit("[", 1)[1].rstrip("]").split()
    assert listed == ["no", "AVX2"] or set(listed) <= cpu.flags()
