"""parties.algorithms.intake: what a party takes from the bus before any of it is used."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from parties.core.errors import PartnerMisbehaved
from parties.algorithms.intake import (PeerIntake, RunPlan, TensorSpec, check_meta, check_plan,
                                      check_tensor)

SPEC = TensorSpec(width=4, max_rows=8)


@dataclass
class Msg:
    arrays: tuple[Any, ...]
    meta: dict[str, Any] = field(default_factory=lambda: {"e": 0, "b": 1})
    publisher: str = "partner"
    topic: str = "emb/run/1"


class Log:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.events.append({"event": event, **kw})


def ok() -> np.ndarray:
    return np.zeros((3, 4), np.float32)


@pytest.mark.parametrize(("arrays", "needle"), [
    ((), "0 arrays"),
    ((ok(), ok()), "2 arrays"),
    ((np.zeros((3, 4), np.float64),), "dtype float64"),
    ((np.zeros((3, 5), np.float32),), "shape (3, 5)"),
    ((np.zeros(12, np.float32),), "shape (12,)"),
    ((np.zeros((9, 4), np.float32),), "9 rows"),
    ((np.zeros((0, 4), np.float32),), "0 rows"),
    ((np.full((3, 4), np.nan, np.float32),), "not finite"),
    ((np.array([[1, 2, np.inf, 4]], np.float32),), "not finite"),
    ((b"raw",), "payload is bytes"),
])
def test_malformed_tensors_name_the_fault(arrays: tuple[Any, ...], needle: str) -> None:
    reason = check_tensor(arrays, SPEC)
    assert reason is not None and needle in reason


def test_exact_rows() -> None:
    assert check_tensor((ok(),), TensorSpec(width=4, max_rows=8, rows=3)) is None
    assert "expected 5" in check_tensor((ok(),), TensorSpec(width=4, max_rows=8, rows=5))


@pytest.mark.parametrize("meta", [{"e": "0"}, {"b": 1.5}, {"k": True}, {"point": [1]}])
def test_non_integer_meta_is_refused(meta: dict[str, Any]) -> None:
    assert "expected an integer" in check_meta(meta)


def test_good_message_is_admitted_and_nothing_counted() -> None:
    intake = PeerIntake(partner="passive", max_bad=3, log=Log())
    intake.partner_id = "partner"
    assert intake.admit(Msg((ok(),)), SPEC) and intake.rejected == 0


def test_the_actives_skip_notice_carries_no_tensor_and_is_admitted() -> None:
    # after a batch's last miss the active party publishes {"skip": true} and no array on
    # its gradient channel: under load (many final misses) the passive party counted them
    # as malformed and ended the run at the 16th
    intake = PeerIntake(partner="active", max_bad=1, log=Log())
    for _ in range(5):
        assert intake.admit(Msg((), {"e": 0, "b": 1, "skip": True}), SPEC)
    assert intake.rejected == 0
    # only a true skip with no arrays: anything else is judged as a tensor
    assert not PeerIntake(partner="active", max_bad=2, log=Log()).admit(
        Msg((), {"e": 0, "b": 1, "skip": 1}), SPEC)
    with pytest.raises(PartnerMisbehaved):
        PeerIntake(partner="active", max_bad=1, log=Log()).admit(
            Msg((np.full((3, 4), np.nan, np.float32),), {"e": 0, "b": 1, "skip": True}), SPEC)


def test_foreign_senders_are_dropped_and_never_end_the_run() -> None:
    log = Log()
    intake = PeerIntake(partner="passive", max_bad=3, log=log)
    intake.partner_id = "partner"
    for _ in range(250):  # well-formed, but not the partner's: never used
        assert not intake.admit(Msg((ok(),), publisher="mallory"), SPEC)
    assert not intake.admit(Msg((np.full((3, 4), np.nan, np.float32),), publisher="eve"), SPEC)
    assert intake.bad == {"mallory": 250, "eve": 1}
    # logged once per episode: the first, then every 100th
    assert [e["count"] for e in log.events] == [1, 100, 200, 1]
    assert all(e["partner"] is False for e in log.events)


def test_the_partners_bad_messages_end_the_run_naming_it() -> None:
    intake = PeerIntake(partner="passive", max_bad=3, log=Log())
    intake.partner_id = "partner"
    nan = (np.full((3, 4), np.nan, np.float32),)
    assert not intake.admit(Msg(nan), SPEC)
    assert not intake.admit(Msg(nan), SPEC)
    with pytest.raises(PartnerMisbehaved) as err:
        intake.admit(Msg(nan), SPEC)
    assert err.value.publisher == "partner" and err.value.count == 3
    assert "passive party" in str(err.value) and "not finite" in str(err.value)


def test_a_fatal_fault_of_the_partner_ends_the_run_at_once() -> None:
    intake = PeerIntake(partner="active", max_bad=16, log=Log())
    intake.partner_id = "partner"
    with pytest.raises(PartnerMisbehaved):
        intake.reject("partner", "5 rows for a batch of 3", fatal=True)
    intake.reject("mallory", "5 rows for a batch of 3", fatal=True)  # not the partner
    assert intake.bad["mallory"] == 1


def test_senders_beyond_the_cap_share_one_counter() -> None:
    intake = PeerIntake(partner="active", max_bad=16, log=Log())
    intake.partner_id = "partner"
    for i in range(2000):
        intake.admit(Msg((ok(),), publisher=f"s{i}"), SPEC)
    assert len(intake.bad) == 1025 and intake.rejected == 2000


def test_max_bad_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_bad"):
        PeerIntake(partner="active", max_bad=0, log=Log())


@given(hnp.arrays(dtype=st.sampled_from([np.float32, np.float64, np.int32, np.uint8]),
                  shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=10)))
def test_any_array_is_judged_without_error_and_admitted_only_if_usable(arr: np.ndarray) -> None:
    reason = check_tensor((arr,), SPEC)
    usable = (arr.dtype == np.float32 and arr.ndim == 2 and arr.shape[1] == 4
              and 1 <= arr.shape[0] <= 8 and bool(np.isfinite(arr).all()))
    assert (reason is None) == usable


PLAN = RunPlan(epochs=3, batches=8, channels=8)


@pytest.mark.parametrize(("meta", "channel", "needle"), [
    ({"e": 10**9, "b": 1}, 1, "epoch 1000000000 outside the run's plan (0..2)"),
    ({"e": -1, "b": 1}, 1, "epoch -1 outside"),
    ({"e": 0, "b": 8}, None, "batch 8 outside the run's plan (0..7)"),
    ({"e": 0, "b": 1}, 8, "channel 8 outside the run's plan (0..7)"),
    ({"e": 0, "b": 2}, 1, "batch 2 on channel 1"),
])
def test_claims_outside_the_plan_are_named(meta: dict[str, Any], channel: int | None,
                                           needle: str) -> None:
    reason = check_plan(meta, PLAN, channel)
    assert reason is not None and needle in reason


def test_claims_inside_the_plan_pass() -> None:
    for e in range(3):
        for b in range(8):  # reassigned attempts reuse the batch id: within the plan
            assert check_plan({"e": e, "b": b, "a": 3}, PLAN, b) is None
    assert check_plan({"split": "val"}, PLAN) is None  # eval messages claim no batch
    # vfl-ps: channels are worker pairs; a batch id on any of them, k must be the channel
    pairs = RunPlan(epochs=3, batches=8, channels=8, channel_is_batch=False)
    assert check_plan({"e": 0, "b": 5, "k": 1}, pairs, 1) is None
    assert "pair 2 on channel 1" in check_plan({"e": 0, "b": 5, "k": 2}, pairs, 1)


def test_out_of_plan_messages_are_rejected_and_counted() -> None:
    intake = PeerIntake(partner="passive", max_bad=4, log=Log(), plan=PLAN)
    intake.partner_id = "partner"
    far = Msg((ok(),), {"e": 10**9, "b": 1})
    assert not intake.admit(far, SPEC, channel=1)
    assert not intake.admit(Msg((ok(),), {"e": 0, "b": 9}), SPEC, channel=1)
    assert not intake.admit(Msg((ok(),), {"e": 0, "b": 1}), SPEC, channel=9)
    assert intake.admit(Msg((ok(),), {"e": 2, "b": 1}), SPEC, channel=1)
    assert intake.out_of_plan == 3 and intake.bad == {"partner": 3}
    # from another sender: dropped and counted, never the end of the run
    for _ in range(10):
        assert not intake.admit(Msg((ok(),), {"e": 10**9, "b": 1}, publisher="mallory"),
                                SPEC, channel=1)
    assert intake.bad["mallory"] == 10
    # the partner's 4th ends the run, naming it
    with pytest.raises(PartnerMisbehaved) as err:
        intake.admit(far, SPEC, channel=1)
    assert err.value.publisher == "partner" and err.value.count == 4
    assert "epoch 1000000000" in err.value.reason


def test_plan_needs_a_schedule() -> None:
    with pytest.raises(ValueError, match="epochs, batches and channels"):
        RunPlan(epochs=0, batches=8, channels=8)


def test_the_driver_never_waits_for_nor_holds_a_channel_with_an_out_of_plan_copy() -> None:
    """Over the in-memory bus: a copy claiming epoch 10^9 at the head of a channel's buffer
    is dropped and counted when the channel is looked at (``Pending``: not ready) or waited
    on (``Await``: the real embedding behind it is taken; it is not put back as a message
    of a later epoch, which used to end every later wait on the channel at once)."""
    import asyncio

    from parties.algorithms.actions import EMB, Await, Pending
    from parties.algorithms.strategy import epoch_acceptor
    from parties.runtime.driver import ActionDriver
    from parties.runtime.timeline import Timeline
    from pubsub import MemoryBroker

    class Topics:
        def emb(self, b: int, party: str = "") -> str:
            return f"emb/r/{b}"

    async def main() -> None:
        async with MemoryBroker() as hub, hub.connect("passive") as pub, \
                hub.connect("active") as sub:
            await sub.subscribe_many([f"emb/r/{c}" for c in range(8)])
            intake = PeerIntake(partner="passive", max_bad=16, log=Log(), plan=PLAN)
            intake.partner_id = pub.client_id
            drv = ActionDriver(sub, topics=Topics(), handles=[], timeline=Timeline("active"),
                               intake=intake, specs={EMB: SPEC})
            far = {"e": 10**9, "b": 0, "a": 0, "u": "x"}
            pub.publish_nowait("emb/r/0", [ok()], far)
            pub.publish_nowait("emb/r/1", [ok()], {**far, "b": 1})
            pub.publish_nowait("emb/r/1", [ok()], {"e": 1, "b": 1, "a": 0, "u": "1.1.0"})
            await asyncio.sleep(0.05)
            ready = await drv.run(_one(Pending(kind=EMB, channels=(0, 1))))
            assert ready == frozenset({1}) and sub.pending("emb/r/0") == 0
            assert intake.out_of_plan == 2 and intake.bad == {pub.client_id: 2}
            r = await drv.run(_one(Await(kind=EMB, channel=1, timeout_s=5.0,
                                         accept=epoch_acceptor(1), worker=0, batch=1)))
            assert r.msg is not None and r.msg.meta["u"] == "1.1.0" and not r.later
            # an in-plan message of a later epoch is still put back for its epoch
            pub.publish_nowait("emb/r/2", [ok()], {"e": 2, "b": 2, "a": 0, "u": "2.2.0"})
            r = await drv.run(_one(Await(kind=EMB, channel=2, timeout_s=5.0,
                                         accept=epoch_acceptor(1), worker=0, batch=2)))
            assert r.later and r.msg is None and sub.pending("emb/r/2") == 1
            assert intake.rejected == 2

    asyncio.run(main())


def _one(action: Any) -> Any:
    """A strategy generator of one action, returning its result."""
    return (yield action)
