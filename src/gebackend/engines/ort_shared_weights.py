"""One copy of a model's weights for every ONNX Runtime instance on this machine (`share_weights`).

Each instance of a model is its own stub process, and each ONNX Runtime session packs its MatMul weights into a
buffer of its own (prepacking), so N instances hold N copies. Here the first instance to load writes the model as
ONNX Runtime optimizes it for this CPU, its prepacked weights included, to one external data file in the model's
cache (`session.save_external_prepacked_constant_initializers`); every instance then loads that file, and ONNX
Runtime maps its weights read-only from it: the kernel's page cache holds one copy, which every instance shares,
and no session packs anything again. Measured serving two instances of a 192 MiB fp32 MLP (AMD EPYC, AVX2): the
server's PSS 1.25x that of one instance with the file shared, 1.69x without, no less throughput
(bench/shared_weights.py; docs/instances.md, "One copy of the weights").

`auto` shares the weights of a model whose files hold at least `SHARE_MIN_BYTES`, on the CPU provider alone (an
accelerator copies the weights to its own memory anyway); a model with custom operator libraries or
`disable_prepacking=1` is served from its own file. A file that cannot be written falls back to the model's own
file, and the load line says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from gebackend.config.option_groups import OrtSessionOptions
from gebackend.heap import return_freed_memory

SHARE_MIN_BYTES = 64 << 20
CACHE = ("shared-weights", "the shared-weights cache", "set share_weights=off")
VERSION = "1"  # bump when what is written changes


def shared_file(path: Path, options: OrtSessionOptions, cpu_only: bool, make_options: Callable,
                disabled: tuple[str, ...]) -> tuple[Path, str]:
    """The file the session loads (`path`, or the shared file) and the load line's words on it ("" when nothing
    was shared and nothing was asked). `make_options()`: the serving session's options, to write the file with."""
    asked = options.share_weights
    if asked == "off":
        return path, ""
    why_not = _refused(options, cpu_only)
    if why_not:
        return path, f" share_weights=on not applied: {why_not}" if asked == "on" else ""
    size = path.stat().st_size
    if size < SHARE_MIN_BYTES:  # its weights may be external data
        from gebackend.compile.precision_cache import model_files

        size = sum(f.stat().st_size for f in model_files(path))
    if asked == "auto" and size < SHARE_MIN_BYTES:
        return path, ""
    try:
        shared, event = _build(path, options, make_options, disabled)
    except Exception as exc:  # noqa: BLE001 - a cache that cannot be written serves the model's own file
        return path, f" share_weights: not shared ({type(exc).__name__}: {str(exc).strip()[:200]})"
    return shared, (f" share_weights: {size >> 20} MiB of weights mapped from {shared.name} "
                    f"({'written now' if event != 'reused' else 'written by an earlier load'}), one copy for every "
                    f"instance")


def _refused(options: OrtSessionOptions, cpu_only: bool) -> str:
    if not cpu_only:
        return "an accelerator holds its own copy of the weights"
    if options.custom_op_libraries:
        return "the model has custom operator libraries"
    if options.disable_prepacking:
        return "disable_prepacking=1 (the shared file holds prepacked weights)"
    return ""


def _build(path: Path, options: OrtSessionOptions, make_options: Callable, disabled: tuple[str, ...]
           ) -> tuple[Path, str]:
    from gebackend import cpu
    from gebackend.compile.ort_session import open_session
    from gebackend.compile.precision_cache import cache_key, cached

    key = cache_key(path, {"share_weights": VERSION, "graph_optimization_level": options.graph_optimization_level,
                           "disabled_optimizers": ",".join(disabled), "cpu": " ".join(sorted(cpu.flags()))})

    def write(folder: Path, name: str) -> Path:
        target = folder / name
        so = make_options()
        so.optimized_model_filepath = str(target)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    f"{Path(name).stem}.weights")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        so.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
        open_session(path, so, disabled=disabled)  # writes the file; the session is dropped at once
        return_freed_memory()  # its weights and their packed copy: the instance keeps neither (measured: 462 -> 268 MiB)
        return target

    # the load line says whether the file was written or reused; the cache's own messages go nowhere
    return cached(path.stem, path, key, f"{path.stem}.shared.onnx", write, lambda message: None, "share_weights",
                  "wrote the shared weights", leaf=CACHE)
