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


def per_device(group: Mapping[str, Any]) -> int:
    """The instances `group` makes on each of its devices: its count, at least 1."""
    return max(1, int(group.get("count") or 1))


def devices(group: Mapping[str, Any]) -> int:
    """The devices `group` spreads over: the GPUs a GPU group lists, else 1."""
    kind = str(group.get("kind") or "KIND_CPU").upper()
    return max(1, len(group.get("gpus") or [])) if kind.endswith("GPU") else 1


def group_sizes(groups: Sequence[Mapping[str, Any]] | None) -> list[int]:
    """The instances each group makes, in config order; one group of one instance when there are none."""
    groups = [g for g in (groups or []) if isinstance(g, Mapping)] or [{"count": 1, "kind": "KIND_CPU"}]
    return [per_device(g) * devices(g) for g in groups]


def instance_total(groups: Sequence[Mapping[str, Any]] | None) -> int:
    """All the instances Triton makes of a model with these `instance_group` entries."""
    return sum(group_sizes(groups))
