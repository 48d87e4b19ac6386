"""Pinned instances: instance positions from Triton's names, CPU sets, sharing, and the options they imply."""

from __future__ import annotations

import os
import threading

import pytest

from gebackend.config.options import BackendOptions, parse_options
from gebackend.runtime.pinning import (
    format_cpu_list,
    instance_position,
    order_by_core,
    parse_cpu_list,
    pin_process,
    pinned_options,
    plan_cpus,
    plan_for_instance,
    should_pin,
)

# As Triton hands the config to the backend: every group named, <model>_<group index> by default.
GROUPS = [
    {"name": "m_0", "count": 2, "kind": "KIND_CPU"},
    {"name": "m_1", "count": 3, "kind": "KIND_CPU"},
]


@pytest.mark.parametrize("name, index", [("m_0_0", 0), ("m_0_1", 1), ("m_1_0", 2), ("m_1_1", 3), ("m_1_2", 4)])
def test_index_from_names_across_groups(name, index):
    assert instance_position("m", name, GROUPS) == (index, 5)


def test_index_without_group_names_in_the_config():
    groups = [{"count": 2, "kind": "KIND_CPU"}, {"count": 3, "kind": "KIND_CPU"}]
    assert instance_position("m", "m_1_2", groups) == (4, 5)
    assert instance_position("m", "m_0_1", groups) == (1, 5)


def test_named_groups_and_model_names_with_underscores():
    groups = [{"name": "fast", "count": 2, "kind": "KIND_CPU"}, {"name": "my_model_1", "count": 1}]
    assert instance_position("my_model", "fast_1", groups) == (1, 3)
    assert instance_position("my_model", "my_model_1_0", groups) == (2, 3)


def test_gpu_groups_count_an_instance_per_listed_gpu():
    groups = [{"name": "g_0", "count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}, {"name": "g_1", "count": 1, "kind": "KIND_CPU"}]
    assert instance_position("g", "g_0_1", groups, device_id=0) == (1, 5)
    assert instance_position("g", "g_0_0", groups, device_id=1) == (2, 5)
    assert instance_position("g", "g_0_1", groups, device_id=1) == (3, 5)
    assert instance_position("g", "g_1_0", groups) == (4, 5)


def test_unknown_names_and_missing_groups_are_a_single_instance():
    assert instance_position("m", "something_else", GROUPS) == (0, 1)
    assert instance_position("m", "m_0_7", GROUPS) == (0, 1)  # beyond the group's count
    assert instance_position("m", "m_0_0", []) == (0, 1)


def test_even_division_in_contiguous_blocks():
    cpus = [plan_cpus(i, 3, range(8)).cpus for i in range(3)]
    assert cpus == [(0, 1, 2), (3, 4, 5), (6, 7)]
    assert all(not plan_cpus(i, 3, range(8)).shared for i in range(3))
    assert [plan_cpus(i, 2, range(2)).cpus for i in range(2)] == [(0,), (1,)]
    assert plan_cpus(0, 1, [4, 5, 6]).cpus == (4, 5, 6)


def test_division_follows_the_usable_cpus_not_their_numbers():
    usable = (2, 3, 8, 9)  # e.g. a taskset or cgroup the server runs in
    assert [plan_cpus(i, 2, usable).cpus for i in range(2)] == [(2, 3), (8, 9)]


def test_explicit_cores_per_instance():
    assert [plan_cpus(i, 2, range(8), 3).cpus for i in range(2)] == [(0, 1, 2), (3, 4, 5)]
    assert not plan_cpus(1, 2, range(8), 3).shared
    capped = plan_cpus(0, 1, range(2), 4)
    assert capped.cpus == (0, 1) and "exceeds the 2 usable core(s)" in capped.note


def test_explicit_cores_that_do_not_fit_wrap_round_robin_and_say_so():
    plans = [plan_cpus(i, 3, range(8), 3) for i in range(3)]
    assert plans[2].cpus == (0, 6, 7)
    assert [p.shared for p in plans] == [True, False, True]
    assert "need" not in plans[1].note and "3 instances x 3 core(s) on 8 usable core(s)" in plans[1].note
    assert "shares its core(s) with instance(s) 1" in plans[2].note


def test_more_instances_than_cores_never_get_zero_cores():
    plans = [plan_cpus(i, 5, range(2)) for i in range(5)]
    assert [p.cpus for p in plans] == [(0,), (1,), (0,), (1,), (0,)]
    assert all(p.shared for p in plans)
    assert "5 instances on 2 usable core(s): instances share cores round-robin" in plans[0].note
    assert "shares its core(s) with instance(s) 3, 5" in plans[0].note
    # 3 on 2: the second instance has its core to itself
    assert [plan_cpus(i, 3, range(2)).shared for i in range(3)] == [True, False, True]


def test_bad_plans_are_refused():
    with pytest.raises(ValueError):
        plan_cpus(0, 1, [])
    with pytest.raises(ValueError):
        plan_cpus(2, 2, range(4))


def test_hyper_thread_siblings_stay_together():
    siblings = {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}  # Linux numbers siblings n apart
    ordered = order_by_core(range(4), siblings.__getitem__)
    assert ordered == (0, 2, 1, 3)
    assert [plan_cpus(i, 2, ordered).cpus for i in range(2)] == [(0, 2), (1, 3)]


def test_cpu_list_format_round_trips():
    assert parse_cpu_list("0-2,5,7-8\n") == (0, 1, 2, 5, 7, 8)
    assert format_cpu_list((8, 0, 1, 2, 5, 7)) == "0-2,5,7-8"
    assert format_cpu_list([3]) == "3"


def test_when_to_pin():
    assert should_pin("auto", 2, 0) and should_pin("auto", 1, 2) and not should_pin("auto", 1, 0)
    assert should_pin("on", 1, 0) and not should_pin("off", 4, 2)


def test_plan_for_instance_reads_the_model_config():
    config = {"instance_group": [{"name": "m_0", "count": 2, "kind": "KIND_CPU"}]}
    plan = plan_for_instance("m", "m_0_1", config, "auto", 0, usable=(0, 1, 2, 3))
    assert plan.cpus == (2, 3) and plan.describe() == "instance 2/2 pinned to CPU(s) 2-3 of 0-3"
    assert plan_for_instance("m", "m_0_1", config, "off", 0, usable=(0, 1)) is None
    assert plan_for_instance("m", "m_0_0", {"instance_group": [{"count": 1}]}, "auto", 0, usable=(0, 1)) is None


def test_pinned_options_size_threads_to_the_cpu_set():
    options, notes = pinned_options(BackendOptions(), plan_cpus(0, 2, range(8)))
    assert (options.session.intra_op_thread_count, options.session.inter_op_thread_count,
            options.session.allow_spinning) == (4, 1, "auto")
    assert notes == []
    shared, _ = pinned_options(BackendOptions(), plan_cpus(0, 3, range(2)))
    assert shared.session.intra_op_thread_count == 1 and shared.session.allow_spinning == "off"


def test_pinned_options_keep_what_the_user_set_and_note_oversubscription():
    user = BackendOptions.make(intra_op_thread_count=4, inter_op_thread_count=2, allow_spinning="on")
    options, notes = pinned_options(user, plan_cpus(0, 3, range(2)))
    assert (options.session.intra_op_thread_count, options.session.inter_op_thread_count,
            options.session.allow_spinning) == (4, 2, "on")
    assert notes and "intra_op_thread_count=4 (set by the user) exceeds the 1 pinned core(s)" in notes[0]


def test_options_parse():
    parsed = parse_options("m", {"pin_instances": "off"}, {"allow_spinning": "0", "ge.aicoreNum": "2|2"}).options
    assert (parsed.instances.pin_instances, parsed.session.allow_spinning,
            parsed.instances.cores_per_instance) == ("off", "off", 2)
    assert parse_options("m", {}, {"pin_instances": "yes"}).options.instances.pin_instances == "on"
    assert BackendOptions().instances.pin_instances == "auto"


def test_pin_process_pins_every_thread(tmp_path):
    """In a child process (pinning is for the process's lifetime): threads started before and after."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable CPUs")
    target = min(os.sched_getaffinity(0))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a thread that already runs, pin, a thread started after
        try:
            ready, seen = threading.Event(), {}
            stop = threading.Event()

            def early():
                ready.set()
                stop.wait()
                seen["early"] = os.sched_getaffinity(0)

            thread = threading.Thread(target=early)
            thread.start()
            ready.wait()
            pin_process({target})
            late = threading.Thread(target=lambda: seen.__setitem__("late", os.sched_getaffinity(0)))
            late.start()
            late.join()
            stop.set()
            thread.join()
            ok = seen["early"] == {target} and seen["late"] == {target} and os.sched_getaffinity(0) == {target}
            os.write(write, b"1" if ok else repr(seen).encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1000)
    os.waitpid(pid, 0)
    assert answer == b"1", answer


def test_a_claimed_plan_names_who_holds_its_cores_and_keeps_the_models_own_sharing():
    alone = plan_cpus(0, 2, range(4))
    moved = alone.claimed((2, 3), ())
    assert moved.cpus == (2, 3) and not moved.shared and moved.note == ""
    crowded = plan_cpus(0, 3, range(2))  # 3 instances on 2 cores: this one will share, whoever claims first
    assert crowded.claimed((0,), ()).shared
    busy = alone.claimed((2, 3), ("other/other_0",))
    assert busy.shared and busy.note == "this instance shares its core(s) with other/other_0"
