"""Config loading: TOML + --set, unknown keys rejected, typed errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from parties.config import DataSection, DpSection, ModelSection, TimeoutsSection, VflConfig, WorkersSection, dump_vfl_config, load_vfl_config
from pubsub.address import BrokerAddress, InvalidAddress
from pubsub.config import ConfigError


def test_defaults_are_the_papers() -> None:
    c = VflConfig()
    assert (c.workers.delta_t0, c.workers.p, c.workers.q, c.timeouts.t_ddl_s, c.lr) == (5, 5, 5, 10.0, 1e-3)


def test_toml_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[vfl]\nepochs = 3\nmodel.bottom_hidden = [16, 8]\n")
    c = load_vfl_config(f, ["vfl.batch_size=64", "lr=0.01", 'data.passive_columns=["a","b"]'])
    assert (c.epochs, c.batch_size, c.lr, c.model.bottom_hidden) == (3, 64, 0.01, (16, 8))
    assert c.data.passive_columns == ("a", "b")
    assert load_vfl_config(None, []) == VflConfig()


def test_round_trip_through_toml(tmp_path: Path) -> None:
    c = VflConfig(epochs=4, data=DataSection(active_columns=("x",), passive_columns=("y",)))
    f = tmp_path / "c.toml"
    f.write_text(dump_vfl_config(c))
    assert load_vfl_config(f) == c


@pytest.mark.parametrize(
    ("sets", "key"),
    [(["epoch=3"], "vfl.epoch"), (["epochs=x"], "vfl.epochs"), (["batch_size=0"], "vfl.batch_size"),
     (["timeouts.t_ddl_s=-1"], "vfl.timeouts.t_ddl_s"), (["algo=magic"], "vfl.algo"),
     (["dp.mu=-1"], "vfl.dp.mu"), (["dp.mu=0"], "vfl.dp.mu"), (["dp.mu=nan"], "vfl.dp.mu"),
     (["dp.noise_multiplier=-0.5"], "vfl.dp.noise_multiplier"),
     (["dp.noise_multiplier=inf"], "vfl.dp.noise_multiplier"),
     (["dp.clip_norm=0"], "vfl.dp.clip_norm"), (["dp.clip_norm=-2"], "vfl.dp.clip_norm"),
     (["dp.delta=0"], "vfl.dp.delta"), (["dp.delta=1.5"], "vfl.dp.delta"),
     (["dp.noise_seed=-1"], "vfl.dp.noise_seed"), (["dp.mu=high"], "vfl.dp.mu"),
     (["timeouts.t_ddl_s=inf"], "vfl.timeouts.t_ddl_s"), (["workers.active_cpus=[-1]"], "vfl.workers.active_cpus"),
     (["workers.passive_cpus=[1,1]"], "vfl.workers.passive_cpus"), (["dp.schema= "], "vfl.dp.schema"),
     (["dp.schema=3"], "vfl.dp.schema"),
     (["active_only_baseline=maybe"], "vfl.active_only_baseline")],
)
def test_bad_values_name_the_key(sets: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_vfl_config(None, sets)
    assert ei.value.key == key


def test_dp_target_and_noise_multiplier_are_exclusive() -> None:
    with pytest.raises(ConfigError) as ei:
        load_vfl_config(None, ["dp.mu=1", "dp.noise_multiplier=2"])
    assert ei.value.key == "vfl.dp.noise_multiplier"
    assert "dp.mu=1.0" in str(ei.value) and "dp.noise_multiplier=2.0" in str(ei.value)


def test_dp_off_by_default_or_with_infinite_mu(tmp_path: Path) -> None:
    assert not VflConfig().dp.enabled
    assert not load_vfl_config(None, ["dp.mu=inf"]).dp.enabled
    assert load_vfl_config(None, ["dp.mu=0.5"]).dp.enabled
    assert load_vfl_config(None, ["dp.noise_multiplier=2", "dp.sgd_noise_multiplier=3"]).dp.enabled
    assert load_vfl_config(None, ["dp.epsilon=3"]).dp.enabled
    with pytest.raises(ConfigError, match="both"):
        load_vfl_config(None, ["dp.noise_multiplier=2"])
    with pytest.raises(ConfigError, match="not both"):
        load_vfl_config(None, ["dp.mu=1", "dp.epsilon=2"])
    for c in (VflConfig(dp=DpSection(mu=float("inf"))), VflConfig(dp=DpSection(mu=2.0, delta=1e-6, noise_seed=3))):
        f = tmp_path / "c.toml"
        f.write_text(dump_vfl_config(c))
        assert load_vfl_config(f) == c


def test_unknown_section(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[vlf]\nepochs = 3\n")
    with pytest.raises(ConfigError, match="vlf"):
        load_vfl_config(f)


def test_broker_address() -> None:
    a = BrokerAddress.parse("tcp://10.0.0.5:6000")
    assert (a.pub_endpoint, a.sub_endpoint, a.control_endpoint) == (
        "tcp://10.0.0.5:6000", "tcp://10.0.0.5:6001", "tcp://10.0.0.5:6002")
    for bad in ("10.0.0.5:6000", "tcp://h:99999", "ipc://x"):
        with pytest.raises(InvalidAddress):
            BrokerAddress.parse(bad)


@pytest.mark.parametrize(
    ("sets", "task"),
    [([], "binary"), (["dataset=adult"], "binary"), (["dataset=california"], "regression"),
     (["dataset=synthetic"], "binary"), (["dataset=my.csv"], "binary"),
     (["dataset=my.csv", "task=regression"], "regression"),
     (["dataset=california", "task=regression"], "regression")],
)
def test_effective_task(sets: list[str], task: str) -> None:
    assert load_vfl_config(None, sets).effective_task == task


@pytest.mark.parametrize(
    ("sets", "key", "needle"),
    [(["task=multiclass"], "vfl.task", "'multiclass'"),
     (["dataset=adult", "task=regression"], "vfl.task", "'adult' is a binary task"),
     (["dataset=california", "vfl.task=binary"], "vfl.task", "regression task"),
     (["data.synthetic_rows=1"], "vfl.data.synthetic_rows", "got 1"),
     (["data.synthetic_features=1"], "vfl.data.synthetic_features", "got 1"),
     (["data.synthetic_features=10", "data.synthetic_informative=11"], "vfl.data.synthetic_informative",
      "got 11"),
     (["data.synthetic_seed=-3"], "vfl.data.synthetic_seed", "got -3"),
     (["synthetic_size=3"], "vfl.synthetic_size", "unknown key")],
)
def test_dataset_keys_are_checked(sets: list[str], key: str, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_vfl_config(None, sets)
    assert ei.value.key == key and needle in str(ei.value)


def test_paper_scale_synthetic_is_allowed() -> None:
    c = load_vfl_config(None, ["vfl.dataset=synthetic", "data.synthetic_rows=200000",
                               "data.synthetic_features=500", "data.synthetic_informative=20"])
    assert (c.data.synthetic_rows, c.data.synthetic_features) == (200_000, 500)


def test_shared_settings_carry_the_task_and_synthetic_parameters() -> None:
    binary = VflConfig(dataset="bank").shared_settings(100)
    regression = VflConfig(dataset="my.csv", task="regression").shared_settings(100)
    assert binary["task"] == "binary" and regression["task"] == "regression"
    assert binary["digest"] != regression["digest"]
    assert "synthetic" not in binary
    a = VflConfig(dataset="synthetic").shared_settings(100_000)
    b = VflConfig(dataset="synthetic", data=DataSection(synthetic_informative=10)).shared_settings(100_000)
    assert a["synthetic"]["informative"] == 20 and a["digest"] != b["digest"]
    assert "scikit-learn" in a["synthetic"]["generator"]
    # the synthetic keys do not matter for other datasets
    assert (VflConfig(dataset="bank", data=DataSection(synthetic_seed=5)).shared_settings(100)["digest"]
            == binary["digest"])


def test_zero_t_ddl_means_no_deadline_and_cpus_are_per_role() -> None:
    c = load_vfl_config(None, ["timeouts.t_ddl_s=0", "workers.active_cpus=[0]", "workers.passive_cpus=[1]"])
    assert (c.workers.cpus("active"), c.workers.cpus("passive")) == ((0,), (1,))
    assert VflConfig().workers.cpus("active") == ()
    # pinning is each party's own business: it never blocks the handshake
    assert c.shared_settings(10) == VflConfig(timeouts=TimeoutsSection(t_ddl_s=0)).shared_settings(10)


def test_algorithm_keys_and_ablation_values() -> None:
    from parties.config import ALGOS, load_vfl_config

    assert ALGOS == ("pubsub", "vfl", "vfl-ps", "avfl", "avfl-ps")
    for algo in ALGOS:
        assert load_vfl_config(sets=[f"algo={algo}"]).algo == algo
    cfg = load_vfl_config(sets=["timeouts.t_ddl_s=0", "workers.delta_t0=1"])  # the ablations
    assert cfg.timeouts.t_ddl_s == 0 and cfg.workers.delta_t0 == 1
    assert load_vfl_config().effective_target == 0.92  # bank
    assert load_vfl_config(sets=["dataset=adult"]).effective_target == 0.90
    assert load_vfl_config(sets=["dataset=california"]).effective_target is None
    assert load_vfl_config(sets=["dataset=california",
                                 "target_metric=0.6"]).effective_target == 0.6
    assert load_vfl_config(sets=["dataset=synthetic"]).evals_per_epoch == 4
    a = load_vfl_config(sets=["algo=vfl-ps", "workers.active=3"]).shared_settings(100)
    b = load_vfl_config(sets=["algo=vfl-ps", "workers.passive=3"]).shared_settings(100)
    assert a["pairs"] == b["pairs"] == 2 and a["digest"] == b["digest"]
    for bad, key in ((["workers.staleness_bound=0"], "vfl.workers.staleness_bound"),
                     (["target_metric=nan"], "vfl.target_metric"),
                     (["algo=VFL"], "vfl.algo")):
        with pytest.raises(ConfigError, match=key):
            load_vfl_config(sets=bad)


def test_auto_worker_mode_is_inline_on_one_core_else_thread() -> None:
    from parties.config import VflConfig

    cfg = VflConfig()
    assert cfg.workers.mode == "auto"
    assert cfg.workers.resolved_mode(1.0) == "inline"
    assert cfg.workers.resolved_mode(0.5) == "inline"  # cgroup quota below one core
    assert cfg.workers.resolved_mode(2.0) == "thread"
    for mode in ("thread", "process", "inline"):
        assert VflConfig(workers=WorkersSection(mode=mode)).workers.resolved_mode(1.0) == mode


def test_per_party_bottom_widths_and_feature_count():
    from parties.config import VflConfig
    from pubsub.config import ConfigError

    cfg = VflConfig(model=ModelSection(bottom_hidden=(64,), passive_bottom_hidden=(16, 16)))
    assert cfg.model.bottom_hidden_for("active") == (64,)
    assert cfg.model.bottom_hidden_for("passive") == (16, 16)
    with pytest.raises(ValueError, match="role"):
        cfg.model.bottom_hidden_for("broker")
    with pytest.raises(ConfigError, match="active_bottom_hidden"):
        VflConfig(model=ModelSection(active_bottom_hidden=(0,)))
    with pytest.raises(ConfigError, match="active_features"):
        VflConfig(data=DataSection(active_features=-1))
    with pytest.raises(ConfigError, match="either a feature count or column lists"):
        VflConfig(data=DataSection(active_features=2, active_columns=("a",), passive_columns=("b",)))


def test_per_passive_party_workers_from_toml_and_set(tmp_path: Path) -> None:
    """``passive_party_workers``: one count per passive party, each party's own workers
    and learning-rate scaling; part of the handshake digest."""
    f = tmp_path / "c.toml"
    f.write_text("[vfl]\npassive_parties = 3\nworkers.per_passive_party = [1, 2, 4]\n")
    c = load_vfl_config(f, ["workers.passive=7"])
    assert c.workers.per_passive_party == (1, 2, 4) and c.passive_workers == (1, 2, 4)
    assert [c.workers_for(p) for p in c.party_ids] == [2, 1, 2, 4]
    assert c.workers_for("passive") == c.workers_for_party("passive") == 1
    assert c.worker_lr("passive3") == pytest.approx(4e-3)  # linear: lr x its own 4
    assert c.worker_lr("passive") == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="passive4"):
        c.workers_for("passive4")
    g = tmp_path / "d.toml"
    g.write_text(dump_vfl_config(c))
    assert load_vfl_config(g) == c
    s = load_vfl_config(None, ["passive_parties=2", "workers.per_passive_party=[2,3]"])
    assert s.workers.per_passive_party == (2, 3)
    assert load_vfl_config(None, ["passive_parties=2", "workers.passive=3"]).passive_workers == (3, 3)
    # the digest the parties compare in their handshake includes the counts
    d1 = s.shared_settings(100)
    d2 = load_vfl_config(None, ["passive_parties=2", "workers.per_passive_party=[3,2]"]
                         ).shared_settings(100)
    assert d1["passive_party_workers"] == [2, 3] and d1["digest"] != d2["digest"]
    # vfl / avfl: one worker whatever the count; vfl-ps: equal counts, paired
    assert load_vfl_config(None, ["algo=avfl", "passive_parties=2",
                                  "workers.per_passive_party=[2,3]"]).workers_for("passive2") == 1
    ps = load_vfl_config(None, ["algo=vfl-ps", "passive_parties=2", "workers.active=4",
                                "workers.per_passive_party=[3,3]"])
    assert [ps.workers_for(p) for p in ps.party_ids] == [3, 3, 3]


@pytest.mark.parametrize(("sets", "why"), [
    (["workers.per_passive_party=[2]"], "several passive parties"),
    (["passive_parties=2", "workers.per_passive_party=[2]"], "one worker count per passive party"),
    (["passive_parties=2", "workers.per_passive_party=[2,3,4]"], "one worker count"),
    (["passive_parties=2", "workers.per_passive_party=[0,3]"], ">= 1"),
    (["passive_parties=2", "workers.per_passive_party=[2,3]", "algo=vfl-ps"], "same count"),
    (["passive_parties=2", "workers.per_passive_party=[2,x]"], None),
])
def test_bad_per_party_workers_name_the_key(sets: list[str], why: str | None) -> None:
    with pytest.raises(ConfigError, match=why) as ei:
        load_vfl_config(None, sets)
    assert ei.value.key == "vfl.workers.per_passive_party"


def test_a_passive_partys_workers_and_rate_follow_its_own_count() -> None:
    """The worker compute and the strategy of ``passive2`` take its own count."""
    import numpy as np

    from parties.models.model import ParameterServer, flat_params, party_modules
    from parties.algorithms.strategy import StrategyConfig
    from parties.models.compute import make_compute

    cfg = VflConfig(passive_parties=2, workers=WorkersSection(per_passive_party=(1, 3)),
                    model=ModelSection(bottom_hidden=(4,), embedding_dim=2))
    x = np.zeros((8, 3), dtype=np.float32)
    ps = ParameterServer(flat_params(party_modules(cfg, "passive", 3)))
    got = {}
    for party in ("passive", "passive2"):
        c = make_compute("passive", cfg, x, None, ps, party=party)
        got[party] = (c.replica.sync_mode, c.replica.opt.param_groups[0]["lr"],
                      StrategyConfig.from_vfl(cfg, "passive", party).workers)
    assert got == {"passive": ("manual", pytest.approx(1e-3), 1),
                   "passive2": ("schedule", pytest.approx(3e-3), 3)}


def test_ps_update_applies_to_averaging_algorithms_with_several_workers() -> None:
    c = VflConfig(algo="pubsub",
                  workers=WorkersSection(ps_update="gradient", active=1, passive=2))
    assert c.ps_update_for("passive") == "gradient"
    assert c.ps_update_for("active") == "average"  # one worker: nothing to combine
    assert c.worker_lr("passive") == pytest.approx(c.lr)  # the server steps every batch
    assert VflConfig(algo="pubsub", workers=WorkersSection(passive=2)).worker_lr("passive") == pytest.approx(2e-3)
    for algo in ("vfl", "vfl-ps", "avfl"):
        assert VflConfig(algo=algo, workers=WorkersSection(ps_update="gradient")).ps_update_for("passive") == "average"
    with pytest.raises(ConfigError) as err:
        VflConfig(workers=WorkersSection(ps_update="sum"))
    assert err.value.key == "vfl.workers.ps_update"


def test_val_per_epoch_sets_the_scorings_per_epoch_and_enters_the_digest() -> None:
    assert VflConfig(dataset="synthetic").evals_per_epoch == 4
    assert VflConfig(dataset="bank").evals_per_epoch == 1
    c = VflConfig(dataset="bank", val_per_epoch=3)
    assert c.evals_per_epoch == 3
    assert c.shared_settings(100)["digest"] != VflConfig(dataset="bank").shared_settings(100)["digest"]
    with pytest.raises(ConfigError) as err:
        VflConfig(val_per_epoch=-1)
    assert err.value.key == "vfl.val_per_epoch"


def test_sync_per_epoch_segments_the_epochs_in_multiples_of_the_scorings() -> None:
    assert VflConfig(dataset="synthetic", val_overlap=False).segments_per_epoch == 4
    assert VflConfig(dataset="synthetic").segments_per_epoch == 1  # scored in flight
    c = VflConfig(dataset="synthetic", sync_per_epoch=16)
    assert (c.segments_per_epoch, c.evals_per_epoch) == (16, 4)
    assert c.shared_settings(100)["digest"] != \
        VflConfig(dataset="synthetic").shared_settings(100)["digest"]
    assert VflConfig(dataset="bank", val_per_epoch=2, sync_per_epoch=6).segments_per_epoch == 6
    for bad in (-1, 6):  # 6 is not a multiple of synthetic's 4 scorings per epoch
        with pytest.raises(ConfigError) as err:
            VflConfig(dataset="synthetic", sync_per_epoch=bad)
        assert err.value.key == "vfl.sync_per_epoch"
        assert str(bad) in str(err.value) or "multiple" in str(err.value)


def test_per_role_torch_threads_default_to_torch_threads():
    from parties.config import VflConfig
    from pubsub.config import ConfigError

    cfg = VflConfig(workers=WorkersSection(torch_threads=3))
    assert cfg.workers.threads_for("active") == 3 and cfg.workers.threads_for("passive2") == 3
    cfg = VflConfig(workers=WorkersSection(torch_threads=3, active_torch_threads=2, passive_torch_threads=1))
    assert cfg.workers.threads_for("active") == 2
    assert cfg.workers.threads_for("passive") == 1 and cfg.workers.threads_for("passive3") == 1
    with pytest.raises(ConfigError, match="passive_torch_threads"):
        VflConfig(workers=WorkersSection(passive_torch_threads=-1))


def test_validation_points_are_scored_in_flight_only_where_every_ps_stays_current() -> None:
    """``vfl.val_overlap``: under ``pubsub`` with two or more workers on every party an
    epoch is one segment and the points inside it are scored while it trains; a
    one-worker party (its PS current only after a segment's flush), another algorithm
    or the switch off keep one segment per point. The parties compare the mode in their
    settings digest."""
    on = VflConfig(algo="pubsub", dataset="bank", val_per_epoch=4)
    assert on.scores_in_flight and on.segments_per_epoch == 1 and on.evals_per_epoch == 4
    assert VflConfig(algo="pubsub", dataset="bank", val_per_epoch=4,
                     sync_per_epoch=8).segments_per_epoch == 8
    for off in (VflConfig(algo="pubsub", dataset="bank", val_per_epoch=4, val_overlap=False),
                VflConfig(algo="pubsub", dataset="bank", val_per_epoch=4,
                          workers=WorkersSection(passive=1)),
                VflConfig(algo="avfl", dataset="bank", val_per_epoch=4),
                VflConfig(algo="pubsub", dataset="bank", val_per_epoch=4, passive_parties=2,
                          workers=WorkersSection(per_passive_party=(2, 1)))):
        assert not off.scores_in_flight and off.segments_per_epoch == 4, off
    assert on.shared_settings(100)["val_overlap"] is True
    assert "val_overlap" not in VflConfig(algo="pubsub", dataset="bank",
                                          val_overlap=False).shared_settings(100)


# ---------------------------------------------------------------------------- sections
def test_an_old_flat_key_is_refused_naming_its_new_place(tmp_path: Path) -> None:
    f = tmp_path / "old.toml"
    f.write_text("[vfl]\nepochs = 2\ndp_mu = 8.0\n")
    with pytest.raises(ConfigError) as ei:
        load_vfl_config(f)
    assert ei.value.key == "vfl.dp_mu"
    assert "vfl.dp.mu" in str(ei.value) and "[vfl.dp] mu" in str(ei.value)
    for item, new in (("w_active=3", "vfl.workers.active"), ("vfl.max_reassign=0",
                      "vfl.timeouts.max_reassign"), ("model=resnet", "vfl.model.bottom"),
                      ("wire_dtype=int8", "vfl.wire.dtype")):
        with pytest.raises(ConfigError, match=f"moved to {new}"):
            load_vfl_config(None, [item])
    # a section's own name is no old key: [vfl.model] is a table, not the old model spec
    assert load_vfl_config(None, ["model.bottom=resnet"]).model.bottom == "resnet"


def test_every_moved_key_has_one_new_place_and_every_section_key_was_placed() -> None:
    from dataclasses import fields

    from parties.config import MOVED_KEYS

    news = list(MOVED_KEYS.values())
    assert len(set(news)) == len(news)
    cfg = VflConfig()
    placed = set()
    for new in news:
        section, leaf = new.split(".")
        assert leaf in {f.name for f in fields(getattr(cfg, section))}, new
        placed.add(new)
    born_in_a_section = {"data.join_key", "data.max_line_bytes",  # keys added after the
                         "data.max_columns", "timeouts.resend_interval_s"}  # flat config
    for section in ("data", "model", "workers", "timeouts", "wire", "dp"):
        for f in fields(getattr(cfg, section)):
            key = f"{section}.{f.name}"
            assert key in placed or key in born_in_a_section, f"{key} has no old key"


def test_a_configuration_saved_before_the_sections_loads_migrated(tmp_path: Path) -> None:
    from parties.config import load_saved_config

    f = tmp_path / "config.toml"
    f.write_text('[vfl]\nalgo = "avfl"\nepochs = 3\nw_active = 1\ndp_mu = 2.0\n'
                 'model = "resnet"\ntop_model = "mlp"\nt_ddl_s = 0.0\n'
                 'active_columns = ["a"]\npassive_columns = ["b"]\nwire_dtype = "int8"\n')
    cfg = load_saved_config(f)
    assert (cfg.algo, cfg.epochs, cfg.workers.active, cfg.dp.mu) == ("avfl", 3, 1, 2.0)
    assert (cfg.model.bottom, cfg.model.top, cfg.timeouts.t_ddl_s) == ("resnet", "mlp", 0.0)
    assert (cfg.data.active_columns, cfg.wire.dtype) == (("a",), "int8")
    f.write_text(dump_vfl_config(cfg))  # one written after the sections loads as it is
    assert load_saved_config(f) == cfg
    f.write_text("[vfl]\nnokey = 1\n")
    with pytest.raises(ConfigError, match="nokey"):
        load_saved_config(f)


def test_the_handshake_digest_is_the_one_before_the_sections() -> None:
    """Parties of this version and of the one before agree on the same settings: the
    digest (recorded before the configuration had sections) depends on the values only."""
    assert VflConfig().shared_settings(100)["digest"] == "f45312db4fcf2e0b"
    c = load_vfl_config(None, ["algo=vfl-ps", "workers.active=3", "workers.passive=3",
                               "data.shuffle=block", "epochs=4"])
    assert c.shared_settings(1000)["digest"] == "f36e8d90e94d941e"
