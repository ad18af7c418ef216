"""``[synth]`` in nested tables: every key of the flat layout has a new place, the flat
keys are refused in a user's file and on the command line (naming the new place) but a
run's own saved config of that layout is migrated, and the checkpoint fingerprint does not
change with the layout."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from pubsub.config import ConfigError, from_mapping
from synth.config import (MOVED_KEYS, AimSection, DataSection, EngineSection, SecAggSection,
                          SynthConfig, dump_synth_config, flat_config, load_synth_config,
                          synth_from_saved)

#: The fields of the flat ``[synth]`` table before it had nested tables.
FLAT_KEYS = (
    "dataset", "label", "drop_columns", "parties", "epsilon", "delta", "mechanism",
    "mst_split", "mst_extra_mb", "aim_rounds", "aim_batch", "aim_split", "aim_max_model_mb",
    "engine", "noise_model", "min_survivors", "min_honest", "secagg_threshold", "bits", "ring",
    "secagg_degree", "fanout", "root_children", "unmask", "split", "split_column",
    "dirichlet_alpha", "party_weights", "numeric_bins", "binning", "domain", "schema_file",
    "holdout_frac", "synthetic_rows", "workload_k", "seed", "noise_seed", "round_timeout_s",
    "handshake_timeout_s", "connect_timeout_s", "max_cells", "engine_iters", "engine_threads",
    "parties_per_process", "stream_rho_frac", "stream_refit", "stream_iters",
    "stream_compare_full")

#: An old run's ``config.toml``, as ``dump_synth_config`` wrote it before the tables.
OLD_SAVED = """[synth]
dataset = "adult"
label = "income"
parties = 4
epsilon = 2.0
mechanism = "aim"
aim_rounds = 3
aim_batch = 2
engine = "neural"
engine_iters = 50
fanout = 2
min_survivors = 3
secagg_threshold = 2
split = "dirichlet"
dirichlet_alpha = 0.5
numeric_bins = 8
round_timeout_s = 5.0
parties_per_process = 2
stream_rho_frac = 0.1
stream_refit = "gum"
"""


def _leaves(cls: type, prefix: str = "") -> set[str]:
    hints = typing.get_type_hints(cls)
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out |= _leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.add(prefix + f.name)
    return out


def test_every_flat_key_has_one_place_and_every_place_a_flat_key() -> None:
    leaves = _leaves(SynthConfig)
    places = {MOVED_KEYS.get(k, k) for k in FLAT_KEYS}
    assert places == leaves  # complete both ways: no key lost, none invented
    assert len(places) == len(FLAT_KEYS)
    assert set(MOVED_KEYS) <= set(FLAT_KEYS)
    assert all(MOVED_KEYS[k] != k for k in MOVED_KEYS)


@pytest.mark.parametrize("old", sorted(MOVED_KEYS))
def test_a_flat_key_is_refused_on_the_command_line_naming_its_new_place(old: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_synth_config(None, [f"{old}=1"])
    assert err.value.key == f"synth.{old}"
    assert f"synth.{MOVED_KEYS[old]}" in str(err.value)


def test_a_flat_key_in_a_users_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(OLD_SAVED)
    with pytest.raises(ConfigError, match=r"moved to synth\.aim\.rounds"):
        load_synth_config(path)


def test_a_saved_flat_config_is_migrated_on_read(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(OLD_SAVED)
    cfg = load_synth_config(path, ["stream.compare_full=true"], saved=True)
    assert (cfg.parties, cfg.epsilon, cfg.mechanism) == (4, 2.0, "aim")
    assert (cfg.aim.rounds, cfg.aim.batch) == (3, 2)
    assert (cfg.engine.name, cfg.engine.iters) == ("neural", 50)
    assert (cfg.secagg.fanout, cfg.secagg.min_survivors, cfg.secagg.threshold) == (2, 3, 2)
    assert (cfg.data.split, cfg.data.dirichlet_alpha, cfg.data.numeric_bins) == (
        "dirichlet", 0.5, 8)
    assert cfg.timeouts.round_timeout_s == 5.0 and cfg.launch.parties_per_process == 2
    assert (cfg.stream.rho_frac, cfg.stream.refit, cfg.stream.compare_full) == (
        0.1, "gum", True)
    # written back in the nested layout, which reads back (saved or not) as the same config
    path.write_text(dump_synth_config(cfg))
    assert "[synth.aim]" in path.read_text()
    assert load_synth_config(path) == cfg == load_synth_config(path, saved=True)
    with pytest.raises(ConfigError, match="synth.aim.rounds"):  # --set is the user's
        load_synth_config(path, ["aim_rounds=2"], saved=True)


def test_the_flat_view_and_the_fingerprint_keep_the_flat_names() -> None:
    from synth.coord.store import OPERATIONAL, fingerprint
    from synth.domain import ColumnSpec, Schema

    cfg = synth_from_saved({"aim_rounds": 3, "engine": "mbi", "fanout": 2})
    flat = flat_config(cfg)
    assert set(flat) == set(FLAT_KEYS) - {"drop_columns", "noise_seed"}  # None: not written
    assert (flat["aim_rounds"], flat["engine"], flat["fanout"]) == (3, "mbi", 2)
    assert OPERATIONAL <= set(FLAT_KEYS)
    schema = Schema(columns=(ColumnSpec(name="a", kind="categorical", levels=("x", "y")),))
    moved_only = dataclasses.replace(cfg, timeouts=dataclasses.replace(
        cfg.timeouts, round_timeout_s=99.0))  # operational: may change on resume
    assert fingerprint(moved_only, schema) == fingerprint(cfg, schema)
    other = dataclasses.replace(cfg, aim=AimSection(rounds=4))
    assert fingerprint(other, schema) != fingerprint(cfg, schema)


def test_nested_tables_and_dotted_keys_are_the_same() -> None:
    a = from_mapping(SynthConfig, {"aim": {"rounds": 7}, "secagg.fanout": 3}, section="synth")
    b = load_synth_config(None, ["synth.aim.rounds=7", "secagg.fanout=3"])
    assert a == b == SynthConfig(aim=AimSection(rounds=7), secagg=SecAggSection(fanout=3))


@pytest.mark.parametrize(("make", "key"), [
    (lambda: AimSection(rounds=0), "synth.aim.rounds"),
    (lambda: EngineSection(name="gan"), "synth.engine.name"),
    (lambda: DataSection(numeric_bins=1), "synth.data.numeric_bins"),
    (lambda: SecAggSection(fanout=4, root_children=5), "synth.secagg.root_children"),
    (lambda: SynthConfig(parties=3, secagg=SecAggSection(min_survivors=4)),
     "synth.secagg.min_survivors"),
    (lambda: SynthConfig(parties=3, data=DataSection(split="sizes", party_weights=(1.0,))),
     "synth.data.party_weights"),
])
def test_errors_name_the_dotted_key(make: typing.Callable[[], object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        make()
    assert err.value.key == key


def test_a_table_where_a_section_belongs_is_refused() -> None:
    with pytest.raises(ConfigError, match="synth.aim"):
        SynthConfig(aim={"rounds": 2})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="expected a table"):
        from_mapping(SynthConfig, {"aim": 3}, section="synth")
