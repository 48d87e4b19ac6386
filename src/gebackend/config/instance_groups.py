"""How many instances Triton makes of a model, read from its `instance_group` entries: the one rule for it.

Triton makes `count` instances per group (a count below 1, or none, is 1, as Triton normalises it), and a GPU
group makes them on each GPU it lists (`gpus`; Triton fills in every visible GPU when the config lists none,
which a config read from disk does not show, so such a group counts once). A model without groups gets one
instance. The shared-memory sizing (`server/shm.py`, from config.pbtxt), the pinning plan
(`runtime/pinning.py`, from the config Triton hands the stub) and ge-backend's execution blocks
(`config/ge_keys.py`) all count through here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def per_device(group: Mapping[str, Any], default_count: int = 1) -> int:
    """The instances `group` makes on each of its devices: its count, else `default_count` (see `group_sizes`)."""
    return max(1, int(group.get("count") or default_count))


def devices(group: Mapping[str, Any]) -> int:
    """The devices `group` spreads over: the GPUs a GPU group lists, else 1."""
    return max(1, len(group.get("gpus") or [])) if _gpu(group) else 1


def group_sizes(groups: Sequence[Mapping[str, Any]] | None, default_count: int = 1) -> list[int]:
    """The instances each group makes, in config order; one group when there are none. A CPU group without a count
    makes `default_count`: 1, but 2 for a model of Triton's onnxruntime backend (`SetDefaultInstanceCount` in core's
    model_config_utils.cc), which a config read from disk names (`default_instance_count`)."""
    groups = [g for g in (groups or []) if isinstance(g, Mapping)] or [{"kind": "KIND_CPU"}]
    return [per_device(g, 1 if _gpu(g) else default_count) * devices(g) for g in groups]


def _gpu(group: Mapping[str, Any]) -> bool:
    return str(group.get("kind") or "KIND_CPU").upper().endswith("GPU")


def default_instance_count(backend: str) -> int:
    """What Triton makes of a CPU group without a count for a model of `backend` (see `group_sizes`)."""
    return 2 if backend in ("onnxruntime", "tensorflow") else 1


def instance_total(groups: Sequence[Mapping[str, Any]] | None, default_count: int = 1) -> int:
    """All the instances Triton makes of a model with these `instance_group` entries."""
    return sum(group_sizes(groups, default_count))
