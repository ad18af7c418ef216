"""The ``sizes`` split (unequal party sizes, IID rows): counts in proportion to the
weights, a seeded partition, and the config's checks."""

from __future__ import annotations

import numpy as np
import pytest

from pubsub.config import ConfigError, from_mapping
from synth.config import DataSection, SynthConfig, dump_synth_config, load_synth_config
from synth.split import party_split, sized_counts


def test_sized_counts_are_proportional_and_sum_to_the_rows() -> None:
    w = [10_000, 50_000, 100_000, 250_000, 500_000]
    c = sized_counts(39_074, w)
    assert sum(c) == 39_074
    exact = [39_074 * x / sum(w) for x in w]
    assert all(abs(a - b) < 1 for a, b in zip(c, exact, strict=True))
    assert c == sorted(c)


def test_sized_counts_give_every_party_a_row() -> None:
    assert sized_counts(5, [1, 1, 1, 1, 1000]) == [1, 1, 1, 1, 1]
    tiny = sized_counts(10, [1e-6, 1, 1])
    assert sum(tiny) == 10 and tiny[0] == 1 and sorted(tiny[1:]) == [4, 5]
    with pytest.raises(ValueError, match="rows cannot"):
        sized_counts(2, [1, 1, 1])
    with pytest.raises(ValueError, match="finite and > 0"):
        sized_counts(10, [1, 0])


def test_sizes_split_is_a_seeded_partition() -> None:
    parts = party_split(1000, 3, seed=4, how="sizes", weights=[1, 2, 7])
    assert [len(p) for p in parts] == [100, 200, 700]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))
    again = party_split(1000, 3, seed=4, how="sizes", weights=[1, 2, 7])
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    with pytest.raises(ValueError, match="needs 3 weights"):
        party_split(1000, 3, seed=4, how="sizes", weights=[1, 2])


def test_config_checks_the_weights_and_round_trips() -> None:
    cfg = from_mapping(SynthConfig, {"parties": 3, "data.split": "sizes",
                                     "data": {"party_weights": [1, 2, 7]}}, section="synth")
    assert cfg.data.party_weights == (1.0, 2.0, 7.0)
    with pytest.raises(ConfigError, match="party_weights"):
        SynthConfig(parties=3, data=DataSection(split="sizes", party_weights=(1.0, 2.0)))
    with pytest.raises(ConfigError, match="party_weights"):
        SynthConfig(parties=2, data=DataSection(split="sizes", party_weights=(1.0, -2.0)))


def test_dumped_config_reads_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = SynthConfig(parties=2, data=DataSection(split="sizes", party_weights=(1.0, 3.0)))
    path = tmp_path / "c.toml"
    path.write_text(dump_synth_config(cfg))
    assert load_synth_config(path) == cfg
