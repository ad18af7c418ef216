"""bench/vfl_multiparty.py without runs: the widths keep the total bottom compute per sample
constant across N, the active party keeps its 140 features and the passive features are
cut among the N - 1 passive parties, and time to target reads the validation history."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mp():
    spec = importlib.util.spec_from_file_location("vfl_multiparty",
                                                  REPO / "bench" / "vfl_multiparty.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_total_bottom_compute_is_constant_across_parties(mp) -> None:
    widths = {n: mp.bottom_width(n) for n in (2, 4, 6, 8, 10)}
    assert widths == {2: 256, 4: 148, 6: 114, 8: 97, 10: 85}
    base = 2 * 9 * 256**2  # the active bottom (always 9 x 256) and one passive bottom
    for n, w in widths.items():  # the hidden layers' multiply-adds, within rounding
        assert abs((9 * 256**2 + (n - 1) * 9 * w**2) / base - 1) < 0.03, (n, w)


@pytest.mark.parametrize("n", [2, 4, 10])
def test_the_active_party_keeps_its_features_and_the_rest_are_cut_among_the_passive(mp, n):
    from parties.data.preflight import resolve_party_columns

    cfg = mp.make_config("synthetic", None, n, "pubsub", rows=1000, epochs=1)
    assert cfg.passive_parties == n - 1
    assert cfg.model.passive_bottom_hidden == (mp.bottom_width(n),) * 9
    assert cfg.model.active_bottom_hidden == (mp.BASE_WIDTH,) * 9
    columns = [f"x{i}" for i in range(mp.FEATURES)] + ["y"]
    _, groups = resolve_party_columns(cfg, pd.DataFrame(columns=columns), "y")
    assert len(groups["active"]) == mp.ACTIVE_FEATURES
    sizes = [len(groups[p]) for p in cfg.party_ids[1:]]
    assert sum(sizes) == mp.FEATURES - mp.ACTIVE_FEATURES and max(sizes) - min(sizes) <= 1


def test_time_to_target_is_the_first_validation_point_reaching_it(mp) -> None:
    hist = [(1.0, 0.7), (2.0, 0.91), (3.0, 0.95)]
    assert mp.time_to_target(hist, 0.9, lower=False) == 2.0
    assert mp.time_to_target(hist, 0.99, lower=False) is None
    assert mp.time_to_target([(1.0, 5.0), (2.0, 3.0)], 4.0, lower=True) == 2.0
