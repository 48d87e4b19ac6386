"""What this CPU can run: its model name and instruction-set flags, and what a `precision_mode` run comes to here
(`PrecisionRun`; each engine says which, through engines/registry.py `precision_run`; OpenVINO asks its CPU plugin's
capabilities). Read by every layer: the int8 quantizer's weight range, the engines, the reports.

CPUs differ between machines (an Intel with AVX-512, BF16 and AMX; an AMD with AVX2 only, where OpenVINO
reports `FP32, INT8`), so nothing downstream assumes a feature: it asks here, and every report that asked
for a precision this CPU lacks says what ran instead (`bf16 requested, this CPU has no BF16: ran f32`).
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

# The flags that decide which kernels run (reported by `gebackend bench` and the docs' benchmark tables).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
# Any of these gives int8 dot products that do not saturate (VNNI, or AMX's int8 tiles); without them AVX2's u8*s8
# instruction adds pairs of products into a saturating int16 (compile/quantize_static.py keeps weights to 7 bits).
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


@dataclass(frozen=True)
class PrecisionRun:
    """What running `requested` on an engine comes to on this CPU."""

    requested: str  # precision_mode: origin | fp16 | bf16 | int8
    ran: str  # what the kernels compute in: f32 | bf16 | f16 | int8
    note: str = ""  # why `ran` is not what was asked for, or what it costs here; empty when nothing to say

    def describe(self) -> str:
        return self.note or f"ran {self.ran}"


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def flags() -> frozenset[str]:
    """The instruction-set flags of this CPU (the first `flags` line of /proc/cpuinfo; empty where there is none)."""
    for line in _cpuinfo().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def model_name() -> str:
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def describe() -> str:
    """This CPU in one line: its model and the ISA flags that matter for inference."""
    have = [f for f in ISA_FLAGS if f in flags()]
    return f"{model_name()} [{' '.join(have) or 'no AVX2'}]"


def fallback_note(requested: str, missing: str, ran: str) -> str:
    return f"{requested} requested, this CPU has no {missing}: ran {ran}"


def int8_note(mode: str) -> str:
    """int8 without VNNI runs on AVX2 kernels: said, because it is slower."""
    if mode == "int8" and flags() and not flags() & VNNI_FLAGS:
        return "int8 requested, this CPU has no VNNI: ran int8 on AVX2 kernels (slower than with VNNI)"
    return ""
