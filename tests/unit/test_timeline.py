"""The per-worker span timeline: bounded storage, totals, file round trip."""

from __future__ import annotations

import asyncio

import pytest

from parties.runtime.timeline import COMM, COMPUTE, WAIT, Timeline, TimedWorker, load_timeline


def test_record_totals_and_roundtrip(tmp_path):
    tl = Timeline("active", max_spans=10)
    base = tl.anchor_perf_s
    tl.record(COMPUTE, 0, 3, base + 1.0, base + 1.5)
    tl.record(WAIT, 1, 4, base + 1.5, base + 1.75)
    tl.record(COMM, 0, 3, base + 2.0, base + 2.125)
    assert tl.totals() == pytest.approx({"compute": 0.5, "wait": 0.25, "comm": 0.125,
                                         "segment": 0.0})
    d = load_timeline(tl.write(tmp_path / "t.json"))
    assert d["kind"] == ["compute", "wait", "comm"]
    assert d["worker"] == [0, 1, 0] and d["batch"] == [3, 4, 3]
    assert d["t0_s"] == pytest.approx([1.0, 1.5, 2.0])
    assert d["t1_s"] == pytest.approx([1.5, 1.75, 2.125])
    assert d["overflow"] == 0 and d["role"] == "active"


def test_bounded_overflow_is_counted():
    tl = Timeline("passive", max_spans=2)
    for i in range(5):
        tl.record(COMPUTE, 0, i, float(i), i + 0.5)
    assert tl.n == 2 and tl.overflow == 3
    assert tl.to_dict()["batch"] == [0, 1]


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="max_spans"):
        Timeline("active", max_spans=0)
    p = tmp_path / "x.json"
    p.write_text('{"kind": [], "worker": [1]}')
    with pytest.raises(ValueError, match="not a timeline"):
        load_timeline(p)
    p.write_text('{"kind": [], "worker": [1], "batch": [], "t0_s": [], "t1_s": []}')
    with pytest.raises(ValueError, match="unequal"):
        load_timeline(p)


class _Handle:
    compute_s = 0.25

    async def forward(self, epoch, b, **kw):
        await asyncio.sleep(0.01)
        return "h"

    async def backward(self, epoch, key, grad):
        raise RuntimeError("boom")

    async def flush(self):
        return None


def test_timed_worker_records_spans_even_on_error():
    tl = Timeline("passive")
    w = TimedWorker(_Handle(), tl, 2)

    async def go():
        assert await w.forward(0, 7) == "h"
        with pytest.raises(RuntimeError, match="boom"):
            await w.backward(0, 7, None)
        await w.flush()

    asyncio.run(go())
    d = tl.to_dict()
    assert d["kind"] == ["compute"] * 3
    assert d["worker"] == [2, 2, 2] and d["batch"] == [7, 7, -1]
    assert d["t1_s"][0] - d["t0_s"][0] >= 0.009
    assert w.compute_s == 0.25
