"""The contract between `gebackend serve` (the CLI) and the model instances it starts inside tritonserver.

The CLI and the instances run in different processes and talk only through the environment and files: the
environment variables that carry the options, the repository and the control folder (`env.py`); the running
servers' registry, so other commands find a server's control folder (`registry.py`); the instances'
heartbeat records the watchdog reads (`heartbeat.py`); the server-wide ledger of pinned cores
(`core_ledger.py`); the lock an instance times its buckets under (`timing_lock.py`) and the costs it leaves
for its model's other instances (`shared_costs.py`); and reading `/proc/<pid>/stat`, which keys the records by
process (`procfs.py`).
"""
