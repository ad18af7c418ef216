"""Config loading: TOML + --set, unknown keys rejected, typed errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from parties.config import VflConfig, dump_vfl_config, load_vfl_config
from pubsub.address import BrokerAddress, InvalidAddress
from pubsub.config import ConfigError


def test_defaults_are_the_papers() -> None:
    c = VflConfig()
    assert (c.delta_t0, c.p, c.q, c.t_ddl_s, c.lr) == (5, 5, 5, 10.0, 1e-3)


def test_toml_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[vfl]\nepochs = 3\nbottom_hidden = [16, 8]\n")
    c = load_vfl_config(f, ["vfl.batch_size=64", "lr=0.01", 'passive_columns=["a","b"]'])
    assert (c.epochs, c.batch_size, c.lr, c.bottom_hidden) == (3, 64, 0.01, (16, 8))
    assert c.passive_columns == ("a", "b")
    assert load_vfl_config(None, []) == VflConfig()


def test_round_trip_through_toml(tmp_path: Path) -> None:
    c = VflConfig(epochs=4, active_columns=("x",), passive_columns=("y",))
    f = tmp_path / "c.toml"
    f.write_text(dump_vfl_config(c))
    assert load_vfl_config(f) == c


@pytest.mark.parametrize(
    ("sets", "key"),
    [(["epoch=3"], "vfl.epoch"), (["epochs=x"], "vfl.epochs"), (["batch_size=0"], "vfl.batch_size"),
     (["t_ddl_s=-1"], "vfl.t_ddl_s"), (["algo=magic"], "vfl.algo"),
     (["dp_mu=-1"], "vfl.dp_mu"), (["dp_mu=0"], "vfl.dp_mu"), (["dp_mu=nan"], "vfl.dp_mu"),
     (["dp_noise_multiplier=-0.5"], "vfl.dp_noise_multiplier"),
     (["dp_noise_multiplier=inf"], "vfl.dp_noise_multiplier"),
     (["dp_clip_norm=0"], "vfl.dp_clip_norm"), (["dp_clip_norm=-2"], "vfl.dp_clip_norm"),
     (["dp_delta=0"], "vfl.dp_delta"), (["dp_delta=1.5"], "vfl.dp_delta"),
     (["dp_noise_seed=-1"], "vfl.dp_noise_seed"), (["dp_mu=high"], "vfl.dp_mu"),
     (["t_ddl_s=inf"], "vfl.t_ddl_s"), (["active_cpus=[-1]"], "vfl.active_cpus"),
     (["passive_cpus=[1,1]"], "vfl.passive_cpus"), (["dp_schema= "], "vfl.dp_schema"),
     (["dp_schema=3"], "vfl.dp_schema"),
     (["active_only_baseline=maybe"], "vfl.active_only_baseline")],
)
def test_bad_values_name_the_key(sets: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_vfl_config(None, sets)
    assert ei.value.key == key


def test_dp_target_and_noise_multiplier_are_exclusive() -> None:
    with pytest.raises(ConfigError) as ei:
        load_vfl_config(None, ["dp_mu=1", "dp_noise_multiplier=2"])
    assert ei.value.key == "vfl.dp_noise_multiplier"
    assert "dp_mu=1.0" in str(ei.value) and "dp_noise_multiplier=2.0" in str(ei.value)


def test_dp_off_by_default_or_with_infinite_mu(tmp_path: Path) -> None:
    assert not VflConfig().dp_enabled
    assert not load_vfl_config(None, ["dp_mu=inf"]).dp_enabled
    assert load_vfl_config(None, ["dp_mu=0.5"]).dp_enabled
    assert load_vfl_config(None, ["dp_noise_multiplier=2", "dp_sgd_noise_multiplier=3"]).dp_enabled
    assert load_vfl_config(None, ["dp_epsilon=3"]).dp_enabled
    with pytest.raises(ConfigError, match="both"):
        load_vfl_config(None, ["dp_noise_multiplier=2"])
    with pytest.raises(ConfigError, match="not both"):
        load_vfl_config(None, ["dp_mu=1", "dp_epsilon=2"])
    for c in (VflConfig(dp_mu=float("inf")), VflConfig(dp_mu=2.0, dp_delta=1e-6, dp_noise_seed=3)):
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
     (["synthetic_rows=1"], "vfl.synthetic_rows", "got 1"),
     (["synthetic_features=1"], "vfl.synthetic_features", "got 1"),
     (["synthetic_features=10", "synthetic_informative=11"], "vfl.synthetic_informative",
      "got 11"),
     (["synthetic_seed=-3"], "vfl.synthetic_seed", "got -3"),
     (["synthetic_size=3"], "vfl.synthetic_size", "unknown key")],
)
def test_dataset_keys_are_checked(sets: list[str], key: str, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_vfl_config(None, sets)
    assert ei.value.key == key and needle in str(ei.value)


def test_paper_scale_synthetic_is_allowed() -> None:
    c = load_vfl_config(None, ["vfl.dataset=synthetic", "synthetic_rows=200000",
                               "synthetic_features=500", "synthetic_informative=20"])
    assert (c.synthetic_rows, c.synthetic_features) == (200_000, 500)


def test_shared_settings_carry_the_task_and_synthetic_parameters() -> None:
    binary = VflConfig(dataset="bank").shared_settings(100)
    regression = VflConfig(dataset="my.csv", task="regression").shared_settings(100)
    assert binary["task"] == "binary" and regression["task"] == "regression"
    assert binary["digest"] != regression["digest"]
    assert "synthetic" not in binary
    a = VflConfig(dataset="synthetic").shared_settings(100_000)
    b = VflConfig(dataset="synthetic", synthetic_informative=10).shared_settings(100_000)
    assert a["synthetic"]["informative"] == 20 and a["digest"] != b["digest"]
    assert "scikit-learn" in a["synthetic"]["generator"]
    # the synthetic keys do not matter for other datasets
    assert (VflConfig(dataset="bank", synthetic_seed=5).shared_settings(100)["digest"]
            == binary["digest"])


def test_zero_t_ddl_means_no_deadline_and_cpus_are_per_role() -> None:
    c = load_vfl_config(None, ["t_ddl_s=0", "active_cpus=[0]", "passive_cpus=[1]"])
    assert (c.cpus("active"), c.cpus("passive")) == ((0,), (1,))
    assert VflConfig().cpus("active") == ()
    # pinning is each party's own business: it never blocks the handshake
    assert c.shared_settings(10) == VflConfig(t_ddl_s=0).shared_settings(10)


def test_algorithm_keys_and_ablation_values() -> None:
    from parties.config import ALGOS, load_vfl_config

    assert ALGOS == ("pubsub", "vfl", "vfl-ps", "avfl", "avfl-ps")
    for algo in ALGOS:
        assert load_vfl_config(sets=[f"algo={algo}"]).algo == algo
    cfg = load_vfl_config(sets=["t_ddl_s=0", "delta_t0=1"])  # the ablations
    assert cfg.t_ddl_s == 0 and cfg.delta_t0 == 1
    assert load_vfl_config().effective_target == 0.92  # bank
    assert load_vfl_config(sets=["dataset=adult"]).effective_target == 0.90
    assert load_vfl_config(sets=["dataset=california"]).effective_target is None
    assert load_vfl_config(sets=["dataset=california",
                                 "target_metric=0.6"]).effective_target == 0.6
    assert load_vfl_config(sets=["dataset=synthetic"]).evals_per_epoch == 4
    a = load_vfl_config(sets=["algo=vfl-ps", "w_active=3"]).shared_settings(100)
    b = load_vfl_config(sets=["algo=vfl-ps", "w_passive=3"]).shared_settings(100)
    assert a["pairs"] == b["pairs"] == 2 and a["digest"] == b["digest"]
    for bad, key in ((["staleness_bound=0"], "vfl.staleness_bound"),
                     (["target_metric=nan"], "vfl.target_metric"),
                     (["algo=VFL"], "vfl.algo")):
        with pytest.raises(ConfigError, match=key):
            load_vfl_config(sets=bad)


def test_auto_worker_mode_is_inline_on_one_core_else_thread() -> None:
    from parties.config import VflConfig

    cfg = VflConfig()
    assert cfg.worker_mode == "auto"
    assert cfg.resolved_worker_mode(1.0) == "inline"
    assert cfg.resolved_worker_mode(0.5) == "inline"  # cgroup quota below one core
    assert cfg.resolved_worker_mode(2.0) == "thread"
    for mode in ("thread", "process", "inline"):
        assert VflConfig(worker_mode=mode).resolved_worker_mode(1.0) == mode


def test_per_party_bottom_widths_and_feature_count():
    from parties.config import VflConfig
    from pubsub.config import ConfigError

    cfg = VflConfig(bottom_hidden=(64,), passive_bottom_hidden=(16, 16))
    assert cfg.bottom_hidden_for("active") == (64,)
    assert cfg.bottom_hidden_for("passive") == (16, 16)
    with pytest.raises(ValueError, match="role"):
        cfg.bottom_hidden_for("broker")
    with pytest.raises(ConfigError, match="active_bottom_hidden"):
        VflConfig(active_bottom_hidden=(0,))
    with pytest.raises(ConfigError, match="active_features"):
        VflConfig(active_features=-1)
    with pytest.raises(ConfigError, match="either a feature count or column lists"):
        VflConfig(active_features=2, active_columns=("a",), passive_columns=("b",))


def test_per_passive_party_workers_from_toml_and_set(tmp_path: Path) -> None:
    """``passive_party_workers``: one count per passive party, each party's own workers
    and learning-rate scaling; part of the handshake digest."""
    f = tmp_path / "c.toml"
    f.write_text("[vfl]\npassive_parties = 3\npassive_party_workers = [1, 2, 4]\n")
    c = load_vfl_config(f, ["w_passive=7"])
    assert c.passive_party_workers == (1, 2, 4) and c.passive_workers == (1, 2, 4)
    assert [c.workers_for(p) for p in c.party_ids] == [2, 1, 2, 4]
    assert c.workers_for("passive") == c.workers_for_party("passive") == 1
    assert c.worker_lr("passive3") == pytest.approx(4e-3)  # linear: lr x its own 4
    assert c.worker_lr("passive") == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="passive4"):
        c.workers_for("passive4")
    g = tmp_path / "d.toml"
    g.write_text(dump_vfl_config(c))
    assert load_vfl_config(g) == c
    s = load_vfl_config(None, ["passive_parties=2", "passive_party_workers=[2,3]"])
    assert s.passive_party_workers == (2, 3)
    assert load_vfl_config(None, ["passive_parties=2", "w_passive=3"]).passive_workers == (3, 3)
    # the digest the parties compare in their handshake includes the counts
    d1 = s.shared_settings(100)
    d2 = load_vfl_config(None, ["passive_parties=2", "passive_party_workers=[3,2]"]
                         ).shared_settings(100)
    assert d1["passive_party_workers"] == [2, 3] and d1["digest"] != d2["digest"]
    # vfl / avfl: one worker whatever the count; vfl-ps: equal counts, paired
    assert load_vfl_config(None, ["algo=avfl", "passive_parties=2",
                                  "passive_party_workers=[2,3]"]).workers_for("passive2") == 1
    ps = load_vfl_config(None, ["algo=vfl-ps", "passive_parties=2", "w_active=4",
                                "passive_party_workers=[3,3]"])
    assert [ps.workers_for(p) for p in ps.party_ids] == [3, 3, 3]


@pytest.mark.parametrize(("sets", "why"), [
    (["passive_party_workers=[2]"], "several passive parties"),
    (["passive_parties=2", "passive_party_workers=[2]"], "one worker count per passive party"),
    (["passive_parties=2", "passive_party_workers=[2,3,4]"], "one worker count"),
    (["passive_parties=2", "passive_party_workers=[0,3]"], ">= 1"),
    (["passive_parties=2", "passive_party_workers=[2,3]", "algo=vfl-ps"], "same count"),
    (["passive_parties=2", "passive_party_workers=[2,x]"], None),
])
def test_bad_per_party_workers_name_the_key(sets: list[str], why: str | None) -> None:
    with pytest.raises(ConfigError, match=why) as ei:
        load_vfl_config(None, sets)
    assert ei.value.key == "vfl.passive_party_workers"


def test_a_passive_partys_workers_and_rate_follow_its_own_count() -> None:
    """The worker compute and the strategy of ``passive2`` take its own count."""
    import numpy as np

    from parties.models.model import ParameterServer, flat_params, party_modules
    from parties.algorithms.strategy import StrategyConfig
    from parties.models.compute import make_compute

    cfg = VflConfig(passive_parties=2, passive_party_workers=(1, 3), bottom_hidden=(4,),
                    embedding_dim=2)
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
    c = VflConfig(algo="pubsub", ps_update="gradient", w_active=1, w_passive=2)
    assert c.ps_update_for("passive") == "gradient"
    assert c.ps_update_for("active") == "average"  # one worker: nothing to combine
    assert c.worker_lr("passive") == pytest.approx(c.lr)  # the server steps every batch
    assert VflConfig(algo="pubsub", w_passive=2).worker_lr("passive") == pytest.approx(2e-3)
    for algo in ("vfl", "vfl-ps", "avfl"):
        assert VflConfig(algo=algo, ps_update="gradient").ps_update_for("passive") == "average"
    with pytest.raises(ConfigError) as err:
        VflConfig(ps_update="sum")
    assert err.value.key == "vfl.ps_update"


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

    cfg = VflConfig(torch_threads=3)
    assert cfg.threads_for("active") == 3 and cfg.threads_for("passive2") == 3
    cfg = VflConfig(torch_threads=3, active_torch_threads=2, passive_torch_threads=1)
    assert cfg.threads_for("active") == 2
    assert cfg.threads_for("passive") == 1 and cfg.threads_for("passive3") == 1
    with pytest.raises(ConfigError, match="passive_torch_threads"):
        VflConfig(passive_torch_threads=-1)


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
                VflConfig(algo="pubsub", dataset="bank", val_per_epoch=4, w_passive=1),
                VflConfig(algo="avfl", dataset="bank", val_per_epoch=4),
                VflConfig(algo="pubsub", dataset="bank", val_per_epoch=4, passive_parties=2,
                          passive_party_workers=(2, 1))):
        assert not off.scores_in_flight and off.segments_per_epoch == 4, off
    assert on.shared_settings(100)["val_overlap"] is True
    assert "val_overlap" not in VflConfig(algo="pubsub", dataset="bank",
                                          val_overlap=False).shared_settings(100)
