"""The collection order for pytest-xdist's worksteal shares (tests/shares.py)."""

from __future__ import annotations

from tests.shares import EXCLUSIVE_BLOCK_S, LEAD, order_for_shares, share_sizes


def _order(items: list[str], workers: int) -> list[str]:
    heavy = {"h240": 240.0, "h170": 170.0, "h90": 90.0, "h40": 40.0}
    return order_for_shares(items, workers, exclusive=lambda s: s.startswith("x"),
                            heavy_s=lambda s: heavy.get(s))


def test_share_sizes_deal_as_worksteal_does() -> None:
    assert share_sizes(10, 3) == [3, 3, 4]
    assert share_sizes(1893, 6) == [315, 315, 315, 316, 316, 316]
    assert share_sizes(2, 4) == [0, 0, 1, 1]


def test_exclusive_first_heavy_at_the_head_of_the_least_loaded_share() -> None:
    light = [f"l{i}" for i in range(30)]
    items = light[:5] + ["h90", "x1"] + light[5:12] + ["h240", "h40", "x2", "h170"] + light[12:]
    out = _order(items, 3)
    assert sorted(out) == sorted(items)  # a permutation: nothing lost or doubled
    sizes = share_sizes(len(items), 3)
    shares = [out[:sizes[0]], out[sizes[0]:sizes[0] + sizes[1]], out[sizes[0] + sizes[1]:]]
    assert shares[0][:2] == ["x1", "x2"]  # the exclusive block leads the first share
    # longest first to the least loaded: 240 -> share 1 (share 0 starts with the block),
    # 170 -> 2, 90 -> 0 (60 + 90 = 150 is the least), 40 -> 0 (150 < 170 < 240)
    assert EXCLUSIVE_BLOCK_S < 170
    assert shares[0][2:4] == ["h90", "h40"]
    # the other shares lead with light tests, then their heavy one: the exclusive block
    # must not wait for a heavy test that started beside it
    assert all(s.startswith("l") for s in shares[1][:LEAD] + shares[2][:LEAD])
    assert shares[1][LEAD] == "h240" and shares[2][LEAD] == "h170"
    # the light tests keep their order
    assert [s for s in out if s.startswith("l")] == light


def test_one_worker_only_puts_the_exclusive_tests_first() -> None:
    items = ["l0", "h240", "x1", "l1"]
    assert _order(items, 1) == ["x1", "l0", "h240", "l1"]
