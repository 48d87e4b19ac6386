"""The one count of a model's instances (config/instance_groups.py) and the three places that use it agreeing.

The shared-memory sizing, the pinning plan and ge-backend's execution-block note counted instances three ways
before: a count of 0 was 1 instance to two of them and 0 to the third, and GPU groups multiplied by their GPUs
in two of them. Triton normalises a count below 1 to 1 (checked against the real server in
tests/e2e/test_pinning.py) and makes a GPU group's count on each GPU it lists.
"""

from __future__ import annotations

import pytest

from gebackend.config.ge_keys import instance_count
from gebackend.config.instance_groups import default_instance_count, group_sizes, instance_total
from gebackend.runtime.pinning import instance_position
from gebackend.server.shm import _model_shm

CASES = [
    (None, [1]),
    ([], [1]),
    ([{"count": 3}], [3]),
    ([{"count": 0, "kind": "KIND_CPU"}], [1]),
    ([{"count": -2}], [1]),
    ([{}], [1]),
    ([{"count": 2}, {"count": 5}, {}], [2, 5, 1]),
    ([{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1, 3]}], [6]),
    ([{"count": 2, "kind": "KIND_GPU"}], [2]),  # from disk: Triton fills in the GPUs, the file does not say them
    ([{"count": 2, "kind": "KIND_CPU", "gpus": [0, 1]}], [2]),  # gpus of a CPU group select nothing
]


@pytest.mark.parametrize("groups,sizes", CASES)
def test_group_sizes_and_total(groups, sizes):
    assert group_sizes(groups) == sizes
    assert instance_total(groups) == sum(sizes)


@pytest.mark.parametrize("groups,sizes", [
    (None, [2]), ([{}], [2]), ([{"kind": "KIND_CPU"}, {"count": 3}], [2, 3]),
    ([{"kind": "KIND_GPU", "gpus": [0, 1]}], [2]),  # GPU groups: 1 per GPU, as for any backend
])
def test_triton_gives_the_onnxruntime_backends_cpu_groups_two_instances(groups, sizes):
    assert default_instance_count("onnxruntime") == 2 and default_instance_count("ge") == 1
    assert group_sizes(groups, default_instance_count("onnxruntime")) == sizes


@pytest.mark.parametrize("groups,sizes", CASES)
def test_execution_blocks_and_pinning_count_the_same_instances(groups, sizes):
    config = {} if groups is None else {"instance_group": groups}
    assert instance_count(config) == sum(sizes)
    named = [dict(g, name=f"m_{i}") for i, g in enumerate(groups or [])]
    assert instance_position("m", "m_0_0", named or []).total == (sum(sizes) if named else 1)


def test_a_count_of_zero_is_one_instance_that_pins_as_the_first(tmp_path):
    groups = [{"name": "m_0", "count": 0, "kind": "KIND_CPU"}, {"name": "m_1", "count": 2, "kind": "KIND_CPU"}]
    assert instance_position("m", "m_0_0", groups) == (0, 3)  # before: m_0_0 was unknown (0 of 1), m_1_1 was 1 of 2
    assert instance_position("m", "m_1_1", groups) == (2, 3)


def test_shared_memory_sizing_counts_through_the_same_rule(tmp_path):
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('backend: "ge"\ninstance_group [ { count: 0, kind: KIND_CPU }, { count: 2 } ]\n')
    assert _model_shm(folder, {}).instances == 3
