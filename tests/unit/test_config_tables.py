"""pubsub.config's nested tables: dotted keys, moved keys refused or migrated, TOML written back."""

from __future__ import annotations

import dataclasses
import tomllib
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub.config import (ConfigError, dump_toml, expand_dotted, from_mapping,
                           migrate_moved, refuse_moved, to_mapping)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Dp:
    mu: float | None = None
    clip_norm: float = 1.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Run:
    MOVED_KEYS: ClassVar[dict[str, str]] = {"dp_mu": "dp.mu", "dp_clip_norm": "dp.clip_norm"}
    epochs: int = 1
    dp: _Dp = dataclasses.field(default_factory=_Dp)


def test_a_dotted_key_is_its_nested_table():
    assert expand_dotted({"dp.mu": 8, "dp": {"clip_norm": 2}, "epochs": 3}) == {
        "dp": {"mu": 8, "clip_norm": 2}, "epochs": 3}
    run = from_mapping(_Run, {"dp.mu": 8.0, "epochs": 2}, section="vfl")
    assert run == _Run(epochs=2, dp=_Dp(mu=8.0))


def test_a_key_that_is_both_a_value_and_a_table_is_refused():
    with pytest.raises(ConfigError) as err:
        expand_dotted({"dp": 1, "dp.mu": 8})
    assert "both a value and a table" in str(err.value)


def test_a_moved_key_is_refused_naming_its_new_place():
    with pytest.raises(ConfigError) as err:
        from_mapping(_Run, {"dp_mu": 8.0}, section="vfl")
    assert err.value.key == "vfl.dp_mu"
    assert "vfl.dp.mu" in str(err.value) and "[vfl.dp] mu" in str(err.value)
    refuse_moved({"epochs": 1}, _Run.MOVED_KEYS, section="vfl")  # nothing moved: no error


def test_a_table_written_before_the_move_is_migrated_on_read():
    old = {"epochs": 4, "dp_mu": 2.0, "dp_clip_norm": 3.0}
    assert from_mapping(_Run, migrate_moved(old, _Run.MOVED_KEYS)) == _Run(
        epochs=4, dp=_Dp(mu=2.0, clip_norm=3.0))


def test_nested_tables_are_written_as_sections_and_read_back():
    text = dump_toml({"vfl": to_mapping(_Run(epochs=3, dp=_Dp(mu=1.5)))})
    assert "[vfl.dp]" in text
    assert tomllib.loads(text) == {"vfl": {"epochs": 3, "dp": {"mu": 1.5, "clip_norm": 1.0}}}


_names = st.text("abcxyz_", min_size=1, max_size=6)
_scalars = st.one_of(st.integers(-5, 5), st.booleans(), st.text("ab c", max_size=4),
                     st.lists(st.integers(0, 3), max_size=3))
_tables = st.recursive(st.dictionaries(_names, _scalars, max_size=4),
                       lambda inner: st.dictionaries(_names, st.one_of(_scalars, inner),
                                                     max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(_tables)
def test_dump_toml_round_trips_nested_tables(data):
    assert tomllib.loads(dump_toml(data)) == data


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Engine:
    name: str = "auto"
    iters: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Fit:
    MOVED_KEYS: ClassVar[dict[str, str]] = {"engine": "engine.name", "engine_iters": "engine.iters"}
    engine: _Engine = dataclasses.field(default_factory=_Engine)


def test_an_old_key_that_names_a_table_now_is_refused_only_as_a_value():
    assert from_mapping(_Fit, {"engine": {"name": "mbi"}, "engine.iters": 3}) == _Fit(
        engine=_Engine(name="mbi", iters=3))
    with pytest.raises(ConfigError) as err:
        from_mapping(_Fit, {"engine": "mbi"}, section="synth")
    assert "synth.engine.name" in str(err.value)
    old = {"engine": "mbi", "engine_iters": 5}
    assert from_mapping(_Fit, migrate_moved(old, _Fit.MOVED_KEYS)) == _Fit(
        engine=_Engine(name="mbi", iters=5))
    assert migrate_moved({"engine": {"iters": 2}}, _Fit.MOVED_KEYS) == {"engine": {"iters": 2}}


def test_an_old_name_inside_its_new_table_is_named_and_every_moved_key_is_listed():
    from parties.config import load_vfl_config

    with pytest.raises(ConfigError, match="this table calls it 'active'"):
        load_vfl_config(None, ["workers.w_active=2"])
    with pytest.raises(ConfigError) as err:
        load_vfl_config(None, ["dp_mu=8", "dp_schema=x.toml"])
    assert err.value.key == "vfl.dp_mu" and "vfl.dp_schema moved to vfl.dp.schema" in str(err.value)
    assert "in a Python mapping: 'dp.mu'" in str(err.value)
    with pytest.raises(ConfigError, match=r"expected a table \(\[vfl.workers\] with keys active"):
        load_vfl_config(None, ["workers=2"])
