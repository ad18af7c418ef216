"""The fixed evaluation grid of FedForge's quality figures (pure): numeric columns in
equal-width bins over their declared ranges, categories as they are, whatever the run's
own binning."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from synth.domain import decode, encode, infer_schema
from synth.quality import fixed_grid_codes, fixed_grid_tv


def _table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(17, 91, n)
    return pd.DataFrame({"age": age, "hours": rng.normal(40, 10, n).clip(1, 99),
                         "job": rng.choice(["a", "b", "c", "d"], n),
                         "y": np.where(age + rng.normal(0, 10, n) > 45, ">50K", "<=50K")})


def test_identical_tables_are_at_distance_zero() -> None:
    t = _table(2000, 0)
    schema = infer_schema(t, numeric_bins=10)
    q = fixed_grid_tv(t, t.copy(), schema)
    assert q["avg_tv_fixed_grid"] == pytest.approx(0.0, abs=1e-12)
    assert q["n_marginals_fixed_grid"] == 4  # C(4, 3)


def test_the_figure_does_not_depend_on_the_runs_numeric_bins() -> None:
    """The same real and synthetic values under schemas of 10 and 32 bins (same ranges)
    score the same on the fixed grid; on each run's own grid they do not."""
    real, syn = _table(3000, 1), _table(3000, 2)
    s10 = infer_schema(real, numeric_bins=10, binning="uniform")
    s32 = infer_schema(real, numeric_bins=32, binning="uniform")
    f10 = fixed_grid_tv(real, syn, s10)["avg_tv_fixed_grid"]
    f32 = fixed_grid_tv(real, syn, s32)["avg_tv_fixed_grid"]
    assert f10 == pytest.approx(f32, abs=1e-12)
    from synth.quality import workload_tv

    own10 = workload_tv(encode(real, s10), encode(syn, s10), s10.domain)["avg_tv"]
    own32 = workload_tv(encode(real, s32), encode(syn, s32), s32.domain)["avg_tv"]
    assert abs(own10 - own32) > 1e-3


def test_coarse_synthesis_scores_worse_on_the_fixed_grid() -> None:
    """Rows decoded from 3 bins per numeric column (values drawn within the bins) are
    further from the real ones on the fixed grid than rows decoded from 32."""
    real = _table(4000, 3)
    rng = np.random.default_rng(0)
    tvs = {}
    for bins in (3, 32):
        s = infer_schema(real, numeric_bins=bins, binning="uniform")
        syn = decode(encode(real, s), s, rng)
        tvs[bins] = fixed_grid_tv(real, syn, s)["avg_tv_fixed_grid"]
    assert tvs[3] > tvs[32] + 0.01, tvs


def test_a_level_merged_away_counts_against_the_synthesis() -> None:
    real = _table(1000, 4)
    syn = real.copy()
    syn.loc[syn["job"] == "d", "job"] = "__other__"
    schema = infer_schema(real, numeric_bins=10)
    real_c, syn_c, dom = fixed_grid_codes(real, syn, schema)
    assert dom.sizes[dom.index("job")] == 5  # a, b, c, d and __other__
    assert fixed_grid_tv(real, syn, schema)["avg_tv_fixed_grid"] > 0.1


def test_values_outside_the_range_and_missing_values_have_their_cells() -> None:
    real = pd.DataFrame({"x": [0.0, 5.0, 10.0, 10.0], "c": ["a", "b", "a", "b"]})
    schema = infer_schema(real, numeric_bins=2, binning="uniform")
    syn = pd.DataFrame({"x": [-3.0, 99.0, np.nan, 10.0], "c": ["a", "b", "a", "b"]})
    _, syn_c, dom = fixed_grid_codes(real, syn, schema, bins=4)
    assert dom.sizes[0] == 5
    assert syn_c[:, 0].tolist() == [0, 3, 4, 3]
    with pytest.raises(ValueError, match="bins"):
        fixed_grid_codes(real, syn, schema, bins=0)
    with pytest.raises(ValueError, match="'x' is not in the synthetic table"):
        fixed_grid_codes(real, syn[["c"]], schema)
