"""The label audit's fast subset: real runs (both parties over an in-memory bus) with an
eavesdropper on the passive parties' gradient topics. Undefended, the attacks read the
labels (the positive control); with the active party's defence they do not; several
passive parties each get their own protected gradients; process workers apply it too."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from parties.config import vfl_config
from parties.data.party import load_party_data
from sim.faults.eavesdrop import GradientTap
from sim.faults.label_attacks import attack_aucs, known_records
from sim.launch.local import run_vfl_in_process
from tests.bounds import above, below


def _audited(keys: dict[str, Any], out: Path, parties: tuple[str, ...] = ("passive",)
             ) -> tuple[dict[str, Any], dict[str, GradientTap], np.ndarray]:
    cfg = vfl_config(keys)
    labels = load_party_data(cfg, "active").y_train
    run_id = uuid.uuid4().hex[:8]
    taps = {p: GradientTap(cfg, run_id, int(labels.shape[0]), party=p) for p in parties}

    async def observe(connect: Any) -> None:
        import asyncio

        await asyncio.gather(*(t.run(connect) for t in taps.values()))

    run_vfl_in_process(cfg, out, run_id=run_id, observer=observe, timeout_s=300)
    return orjson.loads((out / "metrics.json").read_bytes()), taps, labels


@pytest.mark.stochastic
def test_partner_reads_labels_unless_the_active_party_protects_them(tmp_path: Path) -> None:
    base = {"dataset": "bank", "epochs": 2, "seed": 0}
    m, taps, y = _audited(base, tmp_path / "none")
    assert m["dp"]["labels"] == "unprotected"
    tap = taps["passive"]
    assert sorted(tap.grads) == [0, 1] and tap.messages > 0
    known = known_records(y, 200, 0)
    control = attack_aucs(tap.grads, tap.batches, y, known)
    for attack in ("norm", "cosine", "pca", "logistic"):
        above(control[attack]["first"], 0.95, f"{attack} AUC with no defence")

    m, taps, _ = _audited({**base, "labels.defence": "marvell", "labels.noise_seed": 1},
                          tmp_path / "marvell")
    lab = m["dp"]["labels"]
    assert lab["defence"] == "marvell" and lab["strength"] == 2.5 and not lab["label_dp"]
    defended = attack_aucs(taps["passive"].grads, taps["passive"].batches, y, known)
    worst = max(max(v.values()) for v in defended.values())
    below(worst, 0.70, "largest gradient attack AUC under marvell")
    above(m["test_auc"], 0.85, "test AUC under marvell, 2 epochs")


@pytest.mark.stochastic
def test_several_passive_parties_and_process_workers(tmp_path: Path) -> None:
    """Two passive parties, the active party's workers in processes, label DP and the
    gradient noise on: each passive party receives its own protected gradients; the
    label ε is the active party's own ledger's."""
    keys = {"dataset": "synthetic", "data.synthetic_rows": 6000, "data.synthetic_features": 24,
            "passive_parties": 2, "epochs": 2, "workers.mode": "process",
            "workers.active": 2, "workers.passive": 1,
            "labels.defence": "marvell", "labels.epsilon": 1.0, "labels.noise_seed": 2}
    m, taps, y = _audited(keys, tmp_path / "multi", parties=("passive", "passive2"))
    lab = m["dp"]["labels"]
    assert lab["epsilon"] == 1.0 and lab["delta"] == 0.0 and lab["releases"] == 1
    assert lab["guarantee"]["adversary"].startswith("every passive party")
    known = known_records(y, 200, 0)
    for p, tap in taps.items():
        assert sorted(tap.grads) == [0, 1], p
        aucs = attack_aucs(tap.grads, tap.batches, y, known)
        below(aucs["norm"]["last"], 0.65, f"{p}: norm AUC under the defence")
        below(aucs["cosine"]["last"], 0.65, f"{p}: cosine AUC under the defence")
    a, b = taps["passive"].grads[1], taps["passive2"].grads[1]
    both = np.isfinite(a).all(axis=1) & np.isfinite(b).all(axis=1)
    assert both.sum() > 1000 and not np.allclose(a[both], b[both])
