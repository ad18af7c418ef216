"""A scoring message lost on the way (what a broker restart does to a message published
while it is down) is asked for again and published again: the validation and test
embeddings and the end-of-run report (passive to active), "scored", "done" and a
training gradient (active to passive), over the in-memory bus with the first copy of each dropped. Without asking
again the same loss ends the run."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from parties.config import vfl_config
from parties.core.errors import PartnerLost, PartnerStalled
from pubsub.memory import MemoryBroker, MemoryBus

#: the first publication on each of these topics is lost (on ctl/<run>/scored: the
#: decision on scoring in flight, or the first scored point without it)
LOST = (re.compile(r"^eval/[^/]+/val/0$"), re.compile(r"^eval/[^/]+/test$"),
        re.compile(r"^ctl/[^/]+/scored$"), re.compile(r"^ctl/[^/]+/report$"),
        re.compile(r"^ctl/[^/]+/done$"), re.compile(r"^grad/[^/]+/3$"))


class _LossyBus(MemoryBus):
    """A client whose first publication on each :data:`LOST` topic never arrives."""

    lost: list[str] = []

    def publish_nowait(self, topic: str, arrays: Any = (), meta: Any = None, *,
                       copy: bool = True) -> int:
        if any(p.match(topic) for p in LOST) and topic not in _LossyBus.lost:
            _LossyBus.lost.append(topic)
            return 0
        return super().publish_nowait(topic, arrays, meta, copy=copy)


async def _run(cfg: Any, out: Path) -> dict[str, dict[str, Any]]:
    from parties.runtime.serve import serve_party

    _LossyBus.lost = []
    results: dict[str, dict[str, Any]] = {}
    async with MemoryBroker() as hub:
        def connect(name: str = "client", *, config: Any = None) -> MemoryBus:
            return _LossyBus(hub, name=name, config=config)

        async def one(role: str) -> None:
            results[role] = await serve_party(role, cfg, run_id="lossy", out=None,
                                              connect=connect, progress=False)

        async with asyncio.timeout(120), asyncio.TaskGroup() as tg:
            tg.create_task(one("passive"))
            tg.create_task(one("active"))
    return results


def _cfg(**timeouts: Any) -> Any:
    return vfl_config({"dataset": "synthetic", "epochs": 2, "batch_size": 128,
                       "data": {"synthetic_rows": 1500, "synthetic_features": 12,
                                "synthetic_informative": 6},
                       "timeouts": {"liveness_timeout_s": 20.0, **timeouts}})


def test_lost_scoring_messages_are_asked_for_again(tmp_path: Path) -> None:
    res = asyncio.run(_run(_cfg(resend_interval_s=0.3), tmp_path))
    assert len(_LossyBus.lost) == 6, _LossyBus.lost  # each kind was lost once
    run, passive = res["active"], res["passive"]
    assert run["metric"] is not None and len(run["history"]) >= 2, run.keys()
    # the end-of-run report and "done" came on a second asking: nothing missing
    assert run["reports_missing"] == [] and "passive" in run["parties"]
    # the lost gradient of batch 3 was asked for again and came: no batch given up
    assert run["parties"]["passive"]["untrained_batches"] == {}
    assert run["parties"]["active"]["untrained_batches"] == {}
    active = run["parties"]["active"]
    assert active["scoring_resends"]["asked"] >= 3  # val point 0, the test split, report
    assert passive["scoring_resends"]["resent"] >= 3
    assert passive["scoring_resends"]["asked"] >= 2  # the decision on overlap, done
    assert active["scoring_resends"]["resent"] >= 1


def test_without_asking_again_a_lost_message_ends_the_run(tmp_path: Path) -> None:
    with pytest.raises(BaseExceptionGroup) as eg:
        asyncio.run(_run(_cfg(resend_interval_s=0.0, liveness_timeout_s=1.5,
                              t_ddl_s=0.5), tmp_path))
    # the passive party waits for the lost decision (no heartbeat yet), or the active
    # party for lost embeddings: either way the run ends, naming the passive party
    assert eg.group_contains(PartnerStalled) or eg.group_contains(PartnerLost)
    assert "passive" in str(eg.value.exceptions[0])


def test_a_lost_prediction_release_is_asked_for_again(tmp_path: Path) -> None:
    """A prediction's passive release lost on the way (first copy dropped) is asked for
    again by the active party and published again (the same bytes): every row is
    predicted."""
    from parties.runtime.predict import PredictParty
    from sim.launch.local import run_predict_parties, run_vfl_in_process

    run_vfl_in_process(_cfg(resend_interval_s=0.3), tmp_path / "run", quiet=True)
    lost: list[str] = []
    pattern = re.compile(r"^eval/[^/]+/[^/]+/predict$")

    class Lossy(MemoryBus):
        def publish_nowait(self, topic: str, arrays: Any = (), meta: Any = None, *,
                           copy: bool = True) -> int:
            if pattern.match(topic) and topic not in lost:
                lost.append(topic)
                return 0
            return super().publish_nowait(topic, arrays, meta, copy=copy)

    async def main() -> dict[str, Any]:
        async with MemoryBroker() as hub:
            def connect(name: str = "client", *, config: Any = None) -> MemoryBus:
                return Lossy(hub, name=name, config=config)

            parties = {p: PredictParty(p, tmp_path / "run", run_id="lp", timeout_s=20.0,
                                       out=tmp_path / "pred" if p == "active" else None,
                                       connect=connect)
                       for p in ("passive", "active")}
            async with asyncio.timeout(60):
                return await run_predict_parties(parties)

    summary = asyncio.run(main())
    assert lost == ["eval/lp/passive/predict"]
    assert summary["rows"] > 0 and summary["resends_asked"] >= 1
    assert summary["metric"] is not None
