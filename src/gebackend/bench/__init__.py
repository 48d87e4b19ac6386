"""`gebackend bench`: serve generated Triton configs (scenarios) and measure them with the real perf_analyzer.

Modules: `models` (what is served, exported into a cache), `scenarios` (the ladder: one generated
model repository per scenario), `naive_model` (the plain Python-backend baseline), `perf_analyzer`
(finding, running and parsing it), `server` (gebackend serve on free ports), `inprocess` (the ceiling:
the same executor called from threads, no server), `report` (summary JSON/markdown and plots), `runner`.
"""
