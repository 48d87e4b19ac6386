"""Which memory arenas each ONNX Runtime run shrinks back: Triton's onnxruntime backend's model parameter
`memory.enable_memory_arena_shrinkage` ("cpu:0", "gpu:0", "cpu:0;gpu:1"), which it hands to every run's RunOptions.

An arena keeps the memory a run took for the next one; shrinking returns what a run used beyond the arena's first
chunk, which matters to a model whose inputs vary in size (a long request's buffers are not kept for the short ones
after it), at the cost of allocating again. ONNX Runtime fails every run whose list names a device without an arena
(the CPU arena with `enable_mem_arena` off, a GPU the session does not run on), and so does the peer, request after
request. Here the entries this session has an arena for are kept and the others dropped at load, saying why: the
option's parser (`parse`, read by config/options.py) and the entries a session keeps (`run_entries`, read by
engines/onnxruntime.py).
"""

from __future__ import annotations

RUN_CONFIG_KEY = "memory.enable_memory_arena_shrinkage"


def parse(text: str) -> str:
    """The option's value, checked: `cpu:N` / `gpu:N` entries separated by ';' (empty: no shrinkage)."""
    entries = [e.strip().lower() for e in text.split(";") if e.strip()]
    for entry in entries:
        device, colon, index = entry.partition(":")
        if device not in ("cpu", "gpu") or not colon or not index.isdigit():
            raise ValueError("expected device:id entries separated by ';', e.g. cpu:0 or cpu:0;gpu:0")
    return ";".join(entries)


def run_entries(value: str, cpu_arena: bool, gpu: int | None) -> tuple[dict[str, str], str]:
    """The RunOptions config entries for `value` on a session with (or without) the CPU arena and on GPU `gpu` (None:
    the CPU only), and what the engine's load line says of them (empty when `value` is)."""
    kept, dropped = [], []
    for entry in value.split(";") if value else []:
        device, _, index = entry.partition(":")
        if device == "cpu" and index == "0" and cpu_arena:
            kept.append(entry)
        elif device == "gpu" and gpu is not None and int(index) == gpu:
            kept.append(entry)
        else:
            why = ("enable_mem_arena is off" if device == "cpu" and index == "0" else
                   "this session runs on the CPU only" if device == "gpu" and gpu is None else
                   f"this session's device is {'gpu:' + str(gpu) if device == 'gpu' else 'cpu:0'}")
            dropped.append(f"{entry} dropped: {why}")
    if not kept and not dropped:
        return {}, ""
    text = f"{RUN_CONFIG_KEY}={';'.join(kept) or 'none'}" + (f" ({'; '.join(dropped)})" if dropped else "")
    return ({RUN_CONFIG_KEY: ";".join(kept)} if kept else {}), text
