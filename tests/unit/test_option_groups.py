"""Unit tests for gebackend.config.option_groups: the options grouped by the part that reads them, and the one key table."""

from __future__ import annotations

import dataclasses

import pytest

from gebackend.config import option_groups
from gebackend.config.option_groups import FIELDS, BackendOptions
from gebackend.config.options import _KEYS, SECTION_ONLY_FIELDS, parse_options

GROUPS = {f.name: f.default_factory for f in dataclasses.fields(BackendOptions) if dataclasses.is_dataclass(f.default_factory)}


def test_every_group_is_a_frozen_dataclass_of_backend_options():
    assert set(GROUPS) == {"session", "static", "engines", "instances", "diagnostics"}
    assert [f.name for f in dataclasses.fields(BackendOptions) if f.name not in GROUPS] == ["default_max_batch_size"]
    for cls in GROUPS.values():
        assert cls.__dataclass_params__.frozen
        assert getattr(option_groups, cls.__name__) is cls


def test_field_names_are_unique_across_groups_and_fields_says_where_each_lives():
    names = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)] + ["default_max_batch_size"]
    assert len(names) == len(set(names)) == len(FIELDS)
    defaults = BackendOptions()
    for name, group in FIELDS.items():
        holder = getattr(defaults, group) if group else defaults
        assert name in {f.name for f in dataclasses.fields(holder)}
        assert not any(name in {f.name for f in dataclasses.fields(cls)} for g, cls in GROUPS.items() if g != group)


def test_every_field_is_reached_by_a_key_or_is_config_section_only():
    targets = {name for name, _ in _KEYS.values()}
    assert targets <= set(FIELDS), targets - set(FIELDS)
    assert SECTION_ONLY_FIELDS == {"accelerators", "custom_op_libraries"} and not targets & SECTION_ONLY_FIELDS
    assert targets | SECTION_ONLY_FIELDS == set(FIELDS), set(FIELDS) - targets - SECTION_ONLY_FIELDS
    for name in FIELDS:  # a key spelt like a field sets that field, never another
        if name in _KEYS:
            assert _KEYS[name][0] == name


def _distinct_values() -> dict:
    """One value per field, none of them its default."""
    out = {}
    for number, (name, value) in enumerate(BackendOptions().flat().items()):
        out[name] = (f"v{number}",) if value is None or isinstance(value, tuple) else f"v{number}"
    return out


def test_make_flat_and_replace_round_trip():
    values = _distinct_values()
    options = BackendOptions.make(**values)
    assert options.flat() == values
    assert BackendOptions.make(**options.flat()) == options
    assert BackendOptions.make() == BackendOptions() and BackendOptions().replace() == BackendOptions()
    defaults = BackendOptions().flat()
    for name, value in values.items():
        one = BackendOptions().replace(**{name: value})
        assert one == BackendOptions.make(**{name: value})
        assert one.flat() == {**defaults, name: value}
        group = FIELDS[name]
        assert getattr(getattr(one, group) if group else one, name) == value
        back = options.replace(**{name: defaults[name]})
        assert back.flat() == {**values, name: defaults[name]}
    assert options.flat() == values  # replace made copies


def test_replace_keeps_the_untouched_groups():
    options = BackendOptions.make(static_model=True, profiling="dynamic")
    changed = options.replace(allow_spinning="off", intra_op_thread_count=2)
    assert (changed.session.allow_spinning, changed.session.intra_op_thread_count) == ("off", 2)
    assert changed.static is options.static and changed.diagnostics is options.diagnostics
    assert changed.engines is options.engines and changed.instances is options.instances
    assert options.session == BackendOptions().session


@pytest.mark.parametrize("name", ["nope", "session", "static", "options"])
def test_unknown_names_raise_type_error(name):
    with pytest.raises(TypeError, match=repr(name)):
        BackendOptions.make(**{name: 1})
    with pytest.raises(TypeError, match=repr(name)):
        BackendOptions().replace(**{name: 1})


def test_parse_options_builds_the_same_options_as_make():
    parsed = parse_options("m", {"intra_op_thread_count": "2", "default_max_batch_size": "4"},
                           {"static_model": "1", "ge.aicoreNum": "3", "graph.ge.inputShape": " x:-1 "})
    assert parsed.options == BackendOptions.make(intra_op_thread_count=2, default_max_batch_size=4, static_model=True,
                                                 cores_per_instance=3, input_shape="x:-1")
