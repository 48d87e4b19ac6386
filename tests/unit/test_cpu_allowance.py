"""The CPUs a confined process may use (runtime/cpu_allowance.py), on made-up cgroup trees and affinities, and the
engine threads an instance that is not pinned gets from it (runtime/instance.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gebackend.config.options import BackendOptions
from gebackend.runtime import cpu_allowance as allowance_module
from gebackend.runtime.cpu_allowance import Allowance, cgroup_quota, cpu_allowance
from gebackend.runtime.instance import _sized_to_allowance


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_of_the_process_own_cgroup(tmp_path):
    _write(tmp_path / "kubepods" / "pod1" / "cpu.max", "150000 100000\n")
    assert cgroup_quota(tmp_path, lambda: "0::/kubepods/pod1\n") == 1.5


def test_cgroup_v2_without_a_limit_and_inside_a_container_namespace(tmp_path):
    _write(tmp_path / "cpu.max", "max 100000\n")
    assert cgroup_quota(tmp_path, lambda: "0::/\n") is None
    _write(tmp_path / "cpu.max", "100000 100000\n")  # a container sees its own cgroup as the root
    assert cgroup_quota(tmp_path, lambda: "0::/\n") == 1.0


def test_cgroup_v1_quota_on_a_hybrid_tree(tmp_path):
    _write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "200000\n")
    _write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    own = "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/docker/abc\n"
    assert cgroup_quota(tmp_path, lambda: own) == 2.0
    _write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_quota(tmp_path, lambda: own) is None


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cgroup_quota(tmp_path, lambda: "") is None


@pytest.mark.parametrize("affinity, quota, expected", [
    ({0, 1, 2, 3}, None, None),  # the whole machine: each engine's own default
    ({0, 1, 2, 3}, 4.0, None),
    ({2}, None, 1),  # taskset -c 2
    ({0, 1, 2, 3}, 1.5, 2),  # a pod limited to 1.5 CPUs: 2 threads
    ({0, 1}, 0.5, 1),  # the tighter of the two, never 0
])
def test_the_allowance_is_the_tighter_of_affinity_and_quota(affinity, quota, expected):
    found = cpu_allowance(affinity, machine_cpus=4, quota=lambda: quota)
    assert (found.cpus if found else None) == expected
    if found:
        assert ("affinity" in found.why) == (len(affinity) < 4)
        assert ("quota" in found.why) == (quota is not None and quota < 4)


class Log:
    def __init__(self):
        self.lines = []

    def info(self, message):
        self.lines.append(message)

    warn = info


def test_an_unpinned_instance_is_sized_to_the_allowance_unless_the_user_set_threads(monkeypatch):
    monkeypatch.setattr(allowance_module, "cpu_allowance",
                        lambda: Allowance(1, "its CPU affinity is 1 of the machine's 2 CPUs"))
    log = Log()
    sized = _sized_to_allowance("m", BackendOptions(), log)
    assert sized.session.intra_op_thread_count == 1
    assert log.lines == ["gebackend: model 'm': intra_op_threads=1: this process may use 1 CPU(s), as its CPU "
                         "affinity is 1 of the machine's 2 CPUs (ONNX Runtime's default counts the machine's cores); "
                         "set intra_op_thread_count to choose"]
    mine, log = BackendOptions.make(intra_op_thread_count=2), Log()
    assert _sized_to_allowance("m", mine, log).session.intra_op_thread_count == 2  # the user's setting stands
    assert log.lines == ["gebackend: model 'm': intra_op_thread_count=2 (set by the user) exceeds the 1 CPU(s) "
                         "this process may use (its CPU affinity is 1 of the machine's 2 CPUs): threads share CPUs"]
    log = Log()
    _sized_to_allowance("m", BackendOptions.make(intra_op_thread_count=1), log)
    assert log.lines == []


def test_an_unconfined_instance_keeps_the_engine_default(monkeypatch):
    monkeypatch.setattr(allowance_module, "cpu_allowance", lambda: None)
    log = Log()
    assert _sized_to_allowance("m", BackendOptions(), log).session.intra_op_thread_count == 0
    assert log.lines == []
