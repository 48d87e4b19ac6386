"""The conformance run's numbers: counts per engine and mode, the cases behind them, and the docs' Conformance table.

`python -m tests.conformance.report [--markdown] [ENGINE ...]` runs the whole corpus (see `corpus.py`) and
prints the counts and every exception, or with `--markdown` the table kept in docs/results/ (see docs/static-graph.md,
Conformance).
"""

from __future__ import annotations

from typing import Any

from . import corpus


def summary(results: dict[str, dict[str, str | None]], engine: str) -> dict[str, Any]:
    """The counts the docs give, and the cases behind them, for one engine."""
    skipped = {name: row["skip"] for name, row in results.items() if "skip" in row}
    ran = {name: row for name, row in results.items() if "skip" not in row}
    counts = {"cases": len(results), "skipped (not servable)": len(skipped), "run": len(ran),
              "passed plain": sum(row[f"plain/{engine}"] is None for row in ran.values())}
    regressions, plain_fails = [], {}
    for mode in corpus.MODES:
        counts[f"passed ours {mode}"] = sum(row[f"{mode}/{engine}"] is None for row in ran.values())
    for name, row in ran.items():
        if row[f"plain/{engine}"] is None:
            regressions += [(name, mode, row[f"{mode}/{engine}"]) for mode in corpus.MODES if row[f"{mode}/{engine}"] is not None]
        else:
            plain_fails[name] = {k: row[k] for k in (f"plain/{engine}", *(f"{m}/{engine}" for m in corpus.MODES))}
    crashes = [(name, key, why) for name, row in results.items() for key, why in row.items()
               if key.endswith(engine) and why and "CRASHED" in why]
    return {"counts": counts, "regressions": regressions, "crashes": crashes, "plain_fails": plain_fails,
            "skipped": skipped}


def skip_kind(why: str) -> str:
    if "sequence or optional" in why or "optional_type" in why or "sequence_type" in why or "map_type" in why:
        return "sequence/optional/map input or output (only tensors can be served)"
    if "has no Triton equivalent" in why:
        return "element type with no Triton equivalent (float8, float4, int4/uint4, int2/uint2)"
    return why


def failure_kind(why: str) -> str:
    """A plain engine's failure, grouped for the docs."""
    if why.startswith("load fails"):
        return "the engine cannot load it (an op, type or attribute it does not implement)"
    if why.startswith("run fails"):
        return "the engine fails while running it"
    if "shape" in why:
        return "an output has another shape than the reference"
    if "dtype" in why:
        return "an output has another dtype than the reference"
    return "outputs differ from the reference beyond the case's tolerance"


def markdown(results: dict[str, dict[str, str | None]], seconds: float) -> str:
    """The Conformance numbers and exception lists, as kept in docs/results/ (docs/static-graph.md, Conformance)."""
    from collections import defaultdict

    engines = [e for e in corpus.ENGINES if any(f"plain/{e}" in row for row in results.values())]
    models = {name: row for name, row in results.items() if "/" in name}  # model cases are named <folder>/<case>
    nodes = {name: row for name, row in results.items() if name not in models}
    out = [f"{len(nodes)} operator cases from `{corpus.corpus_source()}` and {len(models)} model cases from "
           f"`onnx/backend/test/data/{{{','.join(sorted({n.split('/')[0] for n in models}))}}}`, {seconds:.0f} s on "
           f"this machine (2 processes).", "",
           "| cases | engine | cases run | passed plain | passed ours, dynamic | passed ours, static | ours fails where "
           "plain passes |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, part in (("operators", nodes), ("models", models)):
        for engine in engines if part else ():
            c = summary(part, engine)
            n = c["counts"]
            out.append(f"| {label} | {engine} | {n['run']} | {n['passed plain']} | {n['passed ours dynamic']} | "
                       f"{n['passed ours static']} | {len(c['regressions'])} |")
    skipped = defaultdict(list)
    for name, row in results.items():
        if "skip" in row:
            skipped[skip_kind(row["skip"])].append(name)
    out += ["", f"Not servable, skipped ({sum(map(len, skipped.values()))}):", ""]
    for kind, names in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
        out.append(f"- {kind}: {len(names)}")
    for engine in engines:
        groups = defaultdict(list)
        for name, row in summary(results, engine)["plain_fails"].items():
            groups[failure_kind(row[f"plain/{engine}"])].append(name)
        out += ["", f"<details><summary>Cases plain {engine} fails ({sum(map(len, groups.values()))}), by reason</summary>", ""]
        for kind, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            out.append(f"- {kind} ({len(names)}): " + ", ".join(n[len('test_'):] if n.startswith("test_") else n for n in names))
        out += ["", "</details>"]
    out += ["", "<details><summary>Skipped cases</summary>", ""]
    for kind, names in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
        out.append(f"- {kind} ({len(names)}): " + ", ".join(n[len('test_'):] if n.startswith("test_") else n for n in names))
    out += ["", "</details>"]
    return "\n".join(out)


if __name__ == "__main__":  # python -m tests.conformance.corpus [--markdown] [engine ...]: the numbers for the docs
    import json
    import sys
    import time

    args = [a for a in sys.argv[1:] if a != "--markdown"]
    started = time.perf_counter()
    everything = corpus.run_all(args or None)
    elapsed = time.perf_counter() - started
    if "--markdown" in sys.argv:
        print(markdown(everything, elapsed))
        sys.exit(0)
    print(f"corpus: {corpus.corpus_source()}, {len(everything)} cases, {elapsed:.0f} s")
    for engine in args or corpus.available_engines():
        result = summary(everything, engine)
        print(engine, json.dumps(result["counts"]))
        print(f"  ours fails where plain passes: {len(result['regressions'])}; crashes: {len(result['crashes'])}")
        for name, mode, why in result["regressions"] + result["crashes"]:
            print(f"    {name} [{mode}]: {why}")
        for name, row in result["plain_fails"].items():
            print(f"    plain fails {name}: " + " | ".join(f"{k}: {v or 'ok'}" for k, v in row.items()))
