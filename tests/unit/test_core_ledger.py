"""Unit tests for the server-wide ledger of pinned cores (control/core_ledger.py)."""

from __future__ import annotations

import json
import multiprocessing
import os

from gebackend.control.core_ledger import LEDGER, CoreLedger, choose
from gebackend.runtime.pinning import plan_cpus

CORES = tuple(range(8))


def test_with_nothing_claimed_the_plan_stands():
    assert choose((2, 3), CORES, {}, {}) == (2, 3)


def test_another_models_cores_are_avoided_while_free_ones_remain():
    others = {0: 1, 1: 1}  # model A's two instances on cores 0 and 1
    assert choose((0,), CORES, {}, others) == (2,)
    assert choose((0, 1), CORES, {}, {c: 1 for c in range(7)}) == (0, 7)  # one free core left, then the plan


def test_an_instance_avoids_its_own_models_cores_before_other_models():
    # 2 cores: another model holds core 0; this model's first instance took core 1: the second goes to core 0
    assert choose((1,), (0, 1), {1: 1}, {0: 1}) == (0,)


def _key_of(pid: int) -> str:
    stat = open(f"/proc/{pid}/stat").read()
    return f"{pid}-{stat[stat.rfind(')') + 2:].split()[19]}"


def test_entries_of_dead_processes_are_dropped_and_live_neighbours_named(tmp_path):
    live = _key_of(os.getppid())  # a process that is alive: its claim counts
    (tmp_path / LEDGER).write_text(json.dumps({
        "999999-1": {"model": "ghost", "instance": "ghost_0", "cpus": [0, 1, 2, 3, 4, 5, 6, 7]},  # long gone
        live: {"model": "b", "instance": "b_0_0", "cpus": list(range(7))},
    }))
    ledger = CoreLedger(tmp_path)
    claim = ledger.claim("a", "a_0_0", (0, 1), CORES)
    assert claim.cpus == (0, 7) and claim.neighbours == ("b/b_0_0",)
    assert set(json.loads((tmp_path / LEDGER).read_text())) == {live, ledger.key}
    assert ledger.claim("a", "a_0_0", (0, 1), CORES).cpus == (0, 7)  # a second claim replaces the first
    ledger.release()
    assert set(json.loads((tmp_path / LEDGER).read_text())) == {live}


def _claim_in_child(folder, model, instance, planned, queue):
    queue.put(CoreLedger(folder).claim(model, instance, planned, CORES).cpus)
    queue.get()  # hold the claim (stay alive) until the parent has looked


def test_instances_of_two_models_in_separate_processes_get_disjoint_cores(tmp_path):
    context = multiprocessing.get_context("spawn")
    results, children = [], []
    for model, index in (("a", 0), ("a", 1), ("b", 0), ("b", 1)):
        queue = context.Queue()
        planned = plan_cpus(index, 2, CORES, 2).cpus
        child = context.Process(target=_claim_in_child, args=(tmp_path, model, f"{model}_0_{index}", planned, queue))
        child.start()
        results.append(queue.get(timeout=60))
        children.append((child, queue))
    for child, queue in children:
        queue.put("done")
        child.join(30)
    assert results[:2] == [(0, 1), (2, 3)]  # model a exactly as planned
    assert sorted(results[2:]) == [(4, 5), (6, 7)]  # model b on the cores a left free
    assert os.path.exists(tmp_path / LEDGER)
