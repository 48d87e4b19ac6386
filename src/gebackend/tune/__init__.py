"""`gebackend tune MODEL_DIR`: search the config ladder for one model on this machine with perf_analyzer.

Modules: `space` (the model under tune, the candidates: engine x precision x graph mode x instances x batching,
the precision table, the prior order), `search` (the accuracy guard, the screening with pruning, the interleaved
re-measurement of the best, the time budget; measurement is injected so that decisions are testable on fake
numbers), `measure` (the real measurements: the bench's repository layout, server and perf_analyzer, and its
in-process accuracy check), `config_writer` (config.pbtxt of a candidate, and the winner's with a comment above
every key the tuner chose), `report` (report.md, report.json, tune.png). The CLI is gebackend/cli/tune.py.
"""
