"""The active party's label protection (parties.privacy.labels): randomised response
calibrated, then re-accounted with Google's dp-accounting; the Marvell-style noise's
overlap of the classes; the configuration's checks; metrics; every worker's compute."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parties.config import LabelsSection, VflConfig, vfl_config
from parties.models.compute import make_compute, party_models
from parties.privacy.labels import (LabelLedger, MarvellNoise, RandomizedResponse,
                                    label_protection, labels_line, labels_report,
                                    record_normals)
from parties.privacy.party import party_dp
from pubsub.config import ConfigError
from sim.faults.label_attacks import attack_auc
from tests.bounds import above, below


# ------------------------------------------------------------------ randomised response
@settings(max_examples=40, deadline=None)
@given(eps=st.floats(min_value=0.05, max_value=12.0))
def test_randomized_response_calibrate_then_reaccount(eps: float) -> None:
    """The flip probability calibrated for ε, re-accounted by dp-accounting's PLD of
    randomised response (2 buckets: noise parameter = 2 × flip probability), gives ε at
    δ = 0 (to its discretisation); the likelihood ratio is e^ε exactly."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    rr = RandomizedResponse(epsilon=eps)
    q = rr.flip_probability
    assert 0 < q < 0.5
    assert math.isclose((1 - q) / q, math.exp(eps), rel_tol=1e-12)
    assert math.isclose(RandomizedResponse.epsilon_of(q), eps, rel_tol=1e-9)
    dist = pld.from_randomized_response(noise_parameter=2 * q, num_buckets=2,
                                        value_discretization_interval=1e-5)
    got = dist.get_epsilon_for_delta(0.0)
    assert got >= eps - 1e-9  # the accountant never reports less than the truth
    assert got <= eps + 1e-3


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_randomized_response_refuses_bad_epsilon(bad: float) -> None:
    with pytest.raises(ValueError, match="positive finite"):
        RandomizedResponse(epsilon=bad)


def test_a_large_epsilon_flips_nothing_and_does_not_overflow() -> None:
    for eps in (700.0, 1000.0, 1e6):
        rr = RandomizedResponse(epsilon=eps)
        assert 0.0 <= rr.flip_probability < 1e-300
        assert not rr.flips(1000, seed=1).any()
        assert labels_report(LabelsSection(epsilon=eps))["flip_probability"] == \
            rr.flip_probability


def test_flips_are_a_function_of_seed_and_row() -> None:
    rr = RandomizedResponse(epsilon=1.0)
    a = rr.flips(50_000, seed=7)
    assert np.array_equal(rr.flips(1_000, seed=7), a[:1_000])  # row i's draw is the i-th
    assert not np.array_equal(rr.flips(1_000, seed=8), a[:1_000])
    # 50,000 Bernoulli(0.269): the rate within 5 standard errors
    assert abs(a.mean() - rr.flip_probability) < 5 * math.sqrt(0.27 * 0.73 / 50_000)
    y = (np.arange(10) % 2).astype(np.float32)
    out = rr.apply(y, seed=7)
    assert np.array_equal(out != y, rr.flips(10, seed=7))


def test_ledger_composes_and_reports() -> None:
    led = LabelLedger(epsilon_per_release=0.5)
    led.release()
    assert led.epsilon == 0.5 and led.releases == 1
    led.release()
    assert led.epsilon == 1.0
    assert LabelLedger(epsilon_per_release=None).epsilon is None
    rep = labels_report(LabelsSection(epsilon=1.0), LabelLedger(epsilon_per_release=1.0,
                                                                 releases=1, spent=[1.0]))
    assert rep["epsilon"] == 1.0 and rep["delta"] == 0.0 and rep["label_dp"] is True
    assert rep["guarantee"]["protected_unit"].startswith("one training record's label")
    assert labels_report(LabelsSection()) == "unprotected"
    m = labels_report(LabelsSection(defence="marvell", strength=3.0))
    assert m["defence"] == "marvell" and m["strength"] == 3.0 and "epsilon" not in m
    assert "NOT protected" in labels_line(LabelsSection())
    assert "epsilon 2" in labels_line(LabelsSection(epsilon=2.0))


# ------------------------------------------------------------------ configuration
@pytest.mark.parametrize("keys, where", [
    ({"labels.epsilon": 0}, "vfl.labels.epsilon"),
    ({"labels.epsilon": -2.0}, "vfl.labels.epsilon"),
    ({"labels.epsilon": math.inf}, "vfl.labels.epsilon"),
    ({"labels.epsilon": math.nan}, "vfl.labels.epsilon"),
    ({"labels.defence": "gaussian"}, "vfl.labels.defence"),
    ({"labels.strength": 0.0}, "vfl.labels.strength"),
    ({"labels.strength": math.nan}, "vfl.labels.strength"),
    ({"dataset": "california", "labels.epsilon": 1.0}, "vfl.labels.epsilon"),
    ({"dataset": "california", "labels.defence": "marvell"}, "vfl.labels.defence"),
    ({"task": "regression", "dataset": "x.csv", "label": "y",
      "labels.epsilon": 1.0}, "vfl.labels.epsilon"),
])
def test_bad_label_settings_are_refused_naming_the_key(keys: dict, where: str) -> None:
    with pytest.raises(ConfigError) as exc:
        vfl_config(keys)
    assert exc.value.key == where


def test_label_settings_are_not_shared() -> None:
    """The active party's own: a passive party's config without them trains with it
    (the handshake digest does not change)."""
    plain = VflConfig().shared_settings(100)["digest"]
    for keys in ({"labels.epsilon": 1.0}, {"labels.defence": "marvell"}):
        assert vfl_config(keys).shared_settings(100)["digest"] == plain
    both = vfl_config({"labels.epsilon": 1.0, "labels.defence": "marvell", "dp.mu": 8.0})
    assert both.labels.protected and both.dp.enabled  # one run protects both


# ------------------------------------------------------------------ Marvell-style noise
def _batches(rng: np.random.Generator, n: int, b: int, d: int) -> tuple[np.ndarray, ...]:
    """Gradients like BCE's at the cut layer: positives rarer, larger, of the other sign,
    with a spread of their own across the mean direction."""
    y = (rng.random(n) < 0.12).astype(np.float32)
    w = rng.standard_normal(d)
    scale = np.where(y > 0, -0.6, 0.08) * (1 + 0.3 * rng.standard_normal(n))
    g = scale[:, None] * w[None, :] + rng.standard_normal((n, d)) * np.where(
        y > 0, 0.3, 0.03)[:, None]
    return g.astype(np.float32), y, np.arange(n)


def _noised(noise: MarvellNoise, g: np.ndarray, y: np.ndarray, rows: np.ndarray, b: int,
            epoch: int = 0) -> np.ndarray:
    out = np.empty_like(g)
    for i in range(0, len(g), b):
        s = slice(i, i + b)
        out[s] = noise(g[s], y[s], rows[s], epoch=epoch)
    return out


def test_marvell_noise_hides_norm_direction_and_spread() -> None:
    rng = np.random.default_rng(3)
    g, y, rows = _batches(rng, 20_000, 256, 16)
    assert attack_auc(y, np.linalg.norm(g, axis=1)) > 0.95  # the control
    k = 2.5
    out = _noised(MarvellNoise(k, seed=11), g, y, rows, 256)
    assert out.dtype == np.float32 and out.shape == g.shape
    below(attack_auc(y, np.linalg.norm(out, axis=1)), 0.56, "norm AUC under noise")
    # the best linear score: the mean difference's direction, known to the attacker
    u = out[y > 0].mean(0) - out[y == 0].mean(0)
    lin = attack_auc(y, out @ u)
    expected = 0.5 * (1 + math.erf(1 / (k * math.sqrt(2)) / math.sqrt(2)))  # Φ(1/(k√2))
    below(lin, expected + 0.03, "projection AUC under noise")
    # the spread across the mean direction: the classes' residual norms overlap
    uu = u / np.linalg.norm(u)
    resid = out - (out @ uu)[:, None] * uu[None, :]
    below(attack_auc(y, np.linalg.norm(resid, axis=1)), 0.58, "residual AUC under noise")


def test_marvell_noise_is_the_records_own() -> None:
    """The same records get the same draws in every epoch and for a reassigned batch, so
    averaging over epochs removes nothing; another passive party gets other draws."""
    rng = np.random.default_rng(4)
    g, y, rows = _batches(rng, 256, 256, 8)
    noise = MarvellNoise(2.0, seed=5)
    a = noise(g, y, rows, epoch=0)
    b = noise(g, y, rows, epoch=3)
    assert np.array_equal(a, b)
    c = noise(g, y, rows, epoch=0, party=1)
    assert not np.allclose(a, c)
    assert not np.allclose(MarvellNoise(2.0, seed=6)(g, y, rows), a)


def test_marvell_noise_one_class_batch_and_shapes() -> None:
    rng = np.random.default_rng(5)
    g, y, rows = _batches(rng, 512, 256, 8)
    noise = MarvellNoise(2.0, seed=1)
    noise(g[:256], y[:256], rows[:256])  # learns u, the gap and both covariances
    neg = np.flatnonzero(y[256:] == 0)[:64] + 256
    out = noise(g[neg], y[neg], rows[neg])  # one class: the last estimates
    assert np.isfinite(out).all() and not np.allclose(out, g[neg])
    assert noise(g[:0], y[:0], rows[:0]).shape == (0, 8)
    with pytest.raises(ValueError, match="do not match"):
        noise(g[:10], y[:9], rows[:10])
    with pytest.raises(ValueError, match="positive finite"):
        MarvellNoise(math.inf, seed=1)


def test_record_normals_are_standard_and_stateless() -> None:
    x = record_normals(9, np.arange(40_000), 3)
    assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
    assert abs(np.corrcoef(x[:, 0], x[:, 1])[0, 1]) < 0.02
    assert np.array_equal(record_normals(9, np.array([17, 3]), 3), x[[17, 3]])


# ------------------------------------------------------------------ the workers' compute
class _Data:
    def __init__(self, x: np.ndarray) -> None:
        self.x_train = x
        self.encoder = None


@pytest.mark.parametrize("algo", ["pubsub", "vfl", "vfl-ps", "avfl", "avfl-ps"])
def test_active_compute_sends_protected_gradients(algo: str) -> None:
    """Under every algorithm the active worker trains on the randomised labels and sends
    each passive party its own perturbed gradient (the own bottom's is exact)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 5)).astype(np.float32)
    y = (np.arange(64) % 3 == 0).astype(np.float32)
    keys = {"algo": algo, "batch_size": 16, "passive_parties": 2,
            "labels.defence": "marvell", "labels.epsilon": 1.0, "labels.noise_seed": 3}
    cfg = vfl_config(keys)
    plain = vfl_config({k: v for k, v in keys.items() if not k.startswith("labels")})
    rows = np.arange(16)
    embs = [rng.standard_normal((16, cfg.model.embedding_dim)).astype(np.float32)
            for _ in range(2)]
    grads = {}
    for name, c in (("plain", plain), ("protected", cfg)):
        torch.manual_seed(0)
        _, _, ps = party_models(c, "active", _Data(x), None, 1)
        comp = make_compute("active", c, x, y, ps, noise_seed=3 if c is cfg else None)
        if c is cfg:
            flips = RandomizedResponse(epsilon=1.0).flips(64, 3)
            want = np.where(flips, 1 - y, y)
            assert np.array_equal(comp.labels_of(np.arange(64)).numpy(), want)
        _, grads[name] = comp.top_step(comp.forward_own(rows), embs, rows, 0)
    assert len(grads["protected"]) == 2
    for a, b in zip(grads["plain"], grads["protected"], strict=True):
        assert a.shape == b.shape and not np.allclose(a, b)
    with pytest.raises(ValueError, match="label secret"):
        label_protection(cfg.labels, None, 64)


def test_active_party_workers_share_one_secret() -> None:
    """Every active worker (thread or process) gets the same label secret, so each label
    is randomised once; with the defence off they get none, and the run logs that."""
    events: list[tuple[str, dict]] = []

    class Log:
        def info(self, event: str, **kw: object) -> None:
            events.append((event, kw))

        warning = info

    rows = {"train": 10, "val": 2, "test": 2}
    on = party_dp(vfl_config({"labels.epsilon": 2.0}), "active", "active", 3, rows, log=Log())
    assert len(set(on.noise_seeds)) == 1 and on.noise_seeds[0] is not None
    assert on.label_ledger is not None and on.label_ledger.epsilon == 2.0
    off = party_dp(VflConfig(), "active", "active", 2, rows, log=Log())
    assert off.noise_seeds == (None, None)
    assert [e for e, _ in events] == ["labels.protection", "labels.unprotected"]
    passive = party_dp(vfl_config({"labels.epsilon": 2.0}), "passive", "passive", 2, rows,
                       log=Log())
    assert passive.label_ledger is None  # the passive party knows nothing of the labels
    assert events[-1][0] == "labels.ignored_on_passive"  # and says its setting is ignored
    assert "NOT protected" in labels_line(LabelsSection(), "regression")
    assert "marvell" not in labels_line(LabelsSection(), "regression")
