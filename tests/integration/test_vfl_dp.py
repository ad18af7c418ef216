"""Gaussian DP end to end: short runs on the bundled bank data report the privacy they spent."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

import parties.datasets
from parties.data import load_table
from parties.privacy.dp import epsilon_for_delta
from parties.data.schema import bundled_schema_name

BANK_SCHEMA = Path(parties.datasets.__file__).parent / bundled_schema_name("bank")


def _run(out: Path, *sets: str, transport: str = "broker",
         dataset: str = "bank") -> dict:  # type: ignore[type-arg]
    if transport == "memory":  # both parties in this process (sim.launch.local)
        from parties.config import load_vfl_config
        from sim.launch.local import run_vfl_in_process

        return run_vfl_in_process(load_vfl_config(None, [f"dataset={dataset}", *sets]),
                                  out).metrics
    # the launcher in this process (sim.launch.vfl.run_vfl, as psfl vfl run calls it); the
    # broker and the parties are processes; a party that fails raises LaunchError here
    from parties.config import load_vfl_config
    from sim.launch.vfl import run_vfl

    run_vfl(load_vfl_config(None, [f"dataset={dataset}", *sets]), out, timeout_s=300,
            quiet=True)
    return orjson.loads((out / "metrics.json").read_bytes())


# DP-SGD in worker processes, next to another test on 2 cores: 30-40 s, more under load
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("transport", "worker_mode", "mu", "extra", "min_auc"), [
    # large µ, default max_reassign = 3 and dp_reassign_reserve = 1: σ covers epochs + 1
    # training publications per record (reassignments are charged when they happen),
    # epochs are used; both parties in this process over the in-memory bus
    ("memory", "thread", 8.0, (), 0.6),
    # max_reassign = 0: no reserve, σ covers exactly one publication per epoch, all used;
    # broker and party processes
    # (a loaded machine can take more than the default 10 s to start a party with worker
    # processes and connect)
    ("broker", "process", 1.0, ("timeouts.max_reassign=0", "dp.clip_norm=0.5", "dp.noise_seed=5",
                                "timeouts.connect_timeout_s=60"), 0.5),
])
def test_dp_run_reports_spent_budget_within_the_target(
        tmp_path: Path, transport: str, worker_mode: str, mu: float, extra: tuple[str, ...],
        min_auc: float) -> None:
    epochs = 3
    sample: tuple[str, ...] = ()
    if transport == "broker":
        # 20,000 rows of bank (44 %) with its bundled public schema (a user file with
        # dp_schema): the party and worker processes' start dominates the run; fewer
        # steps carry the same accounting and encoding (test AUC 0.67, as full bank's)
        data = tmp_path / "data" / "bank_sample.csv"
        data.parent.mkdir()
        load_table("bank")[0].sample(n=20000, random_state=0).to_csv(data, index=False)
        sample = ("label=y", f"dp.schema={BANK_SCHEMA}")
    m = _run(tmp_path, f"epochs={epochs}", f"dp.mu={mu}", f"workers.mode={worker_mode}", *extra,
             *sample, transport=transport, dataset=str(data) if sample else "bank")
    cfg = m["config"]
    dp = m["dp"]
    assert dp["enabled"] is True and dp["target_mu"] == mu
    assert 0 < dp["mu"] <= mu
    # no deadline was missed: every training record published once per epoch, every
    # validation record once per validation scoring (each epoch), the test split once
    assert m["dropped_batches"] == 0
    assert dp["publications_max"] == dp["publications_max_train"] == epochs
    assert dp["publications_max_val"] == epochs and dp["publications_max_test"] == 1
    assert dp["published_evaluations"] == epochs + 1
    reserve = min(cfg["dp"]["reassign_reserve"], epochs * cfg["timeouts"]["max_reassign"])
    assert dp["reassign_reserve"] == reserve == (1 if cfg["timeouts"]["max_reassign"] else 0)
    planned = epochs + reserve
    assert dp["publications_planned"] == {"train": planned, "val": epochs, "test": 1}
    assert dp["reassign_reserve_spent_max"] == 0 and dp["reserve_exhausted_batches"] == 0
    # replace-one (sensitivity 2C), half of µ² to the embeddings, half to DP-SGD
    assert dp["noise_multiplier"] == pytest.approx(2 * math.sqrt(2 * planned) / mu)
    assert dp["sgd_noise_multiplier"] == pytest.approx(2 * math.sqrt(2 * planned) / mu)
    assert dp["eval_noise_multipliers"]["test"] == pytest.approx(2 / mu)
    # the validation and test records spend their whole budget on their own releases;
    # a training record spent sqrt(epochs / planned) of it
    assert dp["mu"] == pytest.approx(mu) and dp["mu"] <= mu
    assert dp["release_mu"]["train"] * math.sqrt(epochs) == pytest.approx(
        mu * math.sqrt(epochs / planned))
    assert dp["delta"] == 1e-5 and dp["clip_norm"] == cfg["dp"]["clip_norm"]
    assert dp["epsilon"] == pytest.approx(epsilon_for_delta(dp["mu"], 1e-5))
    assert dp["guarantee"]["neighbouring"].startswith("replace-one")
    assert min_auc < m["test_auc"] <= 1.0
    # the active-only baseline, fitted by the active party after the DP run (its own
    # columns, same rows), chosen on the validation rows
    base = m["active_only"]
    assert base["model"] in ("gb", "mlp") and base["chosen_by"] == "val_auc"
    assert 0.55 < base["test_metric"] < 0.8 and base["n_test"] > 0
    # the passive party's features came from the public schema: its reported width is the
    # schema's (contact 3+1, day, month 12+1, duration, campaign, pdays, previous, poutcome
    # 4+1), not a count of categories seen in its rows
    passive = m["parties"]["passive"]
    assert passive["feature_encoding"] == "public_schema" and passive["n_features"] == 27
    # the log records the plan, never the secret seed
    events = (tmp_path / "events.jsonl").read_text()
    assert '"dp.plan"' in events and '"dp.spent"' in events
    source = "config" if "noise_seed" in cfg["dp"] else "os_entropy"
    assert f'"noise_seed":"{source}"' in events
