"""Pure parts of sim.cluster.relay: LinkSpec validation and the LinkClock link model (no sockets)."""

from __future__ import annotations

import math

import pytest

from sim.cluster.relay import InvalidLinkSpec, LinkClock, LinkSpec, Relay, RelayError


@pytest.mark.parametrize(("field", "value"), [
    ("latency_s", -0.001), ("latency_s", math.inf), ("latency_s", "1"),
    ("bandwidth_bps", 0), ("bandwidth_bps", -5.0), ("bandwidth_bps", math.nan),
    ("loss", 1.0), ("loss", -0.1), ("loss", True),
    ("mss_bytes", 0), ("mss_bytes", 1.5),
    ("seed", 1.5), ("min_rto_s", 0), ("rto_s", -1.0),
])
def test_invalid_spec_raises_typed_error_naming_field_and_value(field: str, value: object) -> None:
    with pytest.raises(InvalidLinkSpec) as ei:
        LinkSpec(**{field: value})  # type: ignore[arg-type]
    assert ei.value.field == field
    assert ei.value.value is value or ei.value.value == value or value != value
    assert field in str(ei.value) and repr(value) in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_spec_is_frozen_kw_only_and_rto_rule() -> None:
    s = LinkSpec(latency_s=0.1)
    with pytest.raises(AttributeError):
        s.latency_s = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        LinkSpec(0.1)  # type: ignore[misc]
    assert s.effective_rto_s == pytest.approx(0.6)          # 3 RTTs of 0.2 s
    assert LinkSpec(latency_s=0.01).effective_rto_s == 0.2  # floor
    assert LinkSpec(latency_s=0.01, min_rto_s=0.05).effective_rto_s == pytest.approx(0.06)
    assert LinkSpec(latency_s=0.1, rto_s=0.3).effective_rto_s == 0.3


def test_64kib_at_100mbit_is_5_24_ms_of_serialisation() -> None:
    spec = LinkSpec(bandwidth_bps=100e6)
    assert spec.transfer_time_s(65536) == pytest.approx(65536 * 8 / 100e6)
    clock = LinkClock(spec)
    [(t, n)] = clock.schedule(65536, now=10.0)
    assert n == 65536 and t == pytest.approx(10.0 + 0.00524288)


def test_serialisation_clock_queues_back_to_back_chunks_and_adds_latency() -> None:
    clock = LinkClock(LinkSpec(latency_s=0.02, bandwidth_bps=8e6))  # 1 byte per microsecond
    [(t1, _)] = clock.schedule(1000, now=0.0)
    [(t2, _)] = clock.schedule(1000, now=0.0005)        # arrives while the link is busy
    assert t1 == pytest.approx(0.001 + 0.02)
    assert t2 == pytest.approx(0.002 + 0.02)            # queued behind the first chunk
    [(t3, _)] = clock.schedule(1000, now=1.0)           # idle link: starts at once
    assert t3 == pytest.approx(1.001 + 0.02)
    assert clock.free_at == pytest.approx(1.001)


def test_unlimited_bandwidth_is_pure_latency_and_floor_keeps_order() -> None:
    clock = LinkClock(LinkSpec(latency_s=0.005))
    assert clock.schedule(10**6, now=1.0) == [(pytest.approx(1.005), 10**6)]
    assert clock.schedule(10, now=1.0, not_before=2.0) == [(2.0, 10)]
    with pytest.raises(ValueError):
        clock.schedule(0, now=1.0)


def test_loss_delays_segment_and_everything_behind_it_by_rto() -> None:
    spec = LinkSpec(latency_s=0.01, bandwidth_bps=None, loss=0.3, mss_bytes=100, seed=7,
                    rto_s=0.5)
    clock = LinkClock(spec)
    total = 0
    lossy = None
    for i in range(200):
        pieces = clock.schedule(1000, now=float(i))        # 10 segments, 1 s apart
        assert sum(n for _, n in pieces) == 1000
        times = [t for t, _ in pieces]
        assert times == sorted(times) and times[0] >= i + 0.01 - 1e-12
        total += len(pieces)
        if len(pieces) > 1 and lossy is None:
            lossy = (i, pieces)
    assert clock.segments == 2000
    # ~ 2000 * 0.3/(1-0.3) losses (geometric per segment)
    assert 700 < clock.segments_lost < 1050
    assert lossy is not None
    # every delay is a whole number of RTOs with backoff: rto * (2**k - 1)
    i0, pieces = lossy
    assert pieces[-1][0] > i0 + 0.01 + 0.4
    for t, _ in pieces:
        n_rto = (t - i0 - 0.01) / 0.5
        assert any(abs(n_rto - (2**k - 1)) < 1e-6 for k in range(8))


def test_loss_is_reproducible_with_seed_and_directions_differ() -> None:
    spec = LinkSpec(loss=0.2, seed=3, mss_bytes=10)
    a, b, c = LinkClock(spec), LinkClock(spec), LinkClock(spec, stream="down")
    ra = [a.schedule(500, now=0.0) for _ in range(20)]
    rb = [b.schedule(500, now=0.0) for _ in range(20)]
    rc = [c.schedule(500, now=0.0) for _ in range(20)]
    assert ra == rb and ra != rc


def test_relay_rejects_bad_construction_and_unknown_upstreams() -> None:
    with pytest.raises(RelayError):
        Relay([], LinkSpec())
    r = Relay([("127.0.0.1", 5555)], LinkSpec())
    with pytest.raises(RelayError, match="unknown upstream"):
        r.endpoint_for(("127.0.0.1", 1))
    with pytest.raises(RelayError, match="not started"):
        r.endpoint_for("127.0.0.1:5555")
    with pytest.raises(RelayError):
        Relay.for_broker("127.0.0.1:5555", LinkSpec())
    b = Relay.for_broker("tcp://127.0.0.1:5555", LinkSpec())
    assert b.routes == {"pub": ("127.0.0.1", 5555), "sub": ("127.0.0.1", 5556),
                        "control": ("127.0.0.1", 5557)}
