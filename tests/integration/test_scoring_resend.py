"""A scoring message lost on the way (what a broker restart does to a message published
while it is down) is asked for again and published again: the validation and test
embeddings (passive to active) and "scored" (active to passive), over the in-memory bus
with the first copy of each dropped. Without asking again the same loss ends the run."""

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
        re.compile(r"^ctl/[^/]+/scored$"))


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
    assert len(_LossyBus.lost) == 3, _LossyBus.lost  # each kind was lost once
    run, passive = res["active"], res["passive"]
    assert run["metric"] is not None and len(run["history"]) >= 2, run.keys()
    active = run["parties"]["active"]
    assert active["scoring_resends"]["asked"] >= 2  # val point 0 and the test split
    assert passive["scoring_resends"]["resent"] >= 2
    assert passive["scoring_resends"]["asked"] >= 1  # the lost decision on overlap
    assert active["scoring_resends"]["resent"] >= 1


def test_without_asking_again_a_lost_message_ends_the_run(tmp_path: Path) -> None:
    with pytest.raises(BaseExceptionGroup) as eg:
        asyncio.run(_run(_cfg(resend_interval_s=0.0, liveness_timeout_s=1.5,
                              t_ddl_s=0.5), tmp_path))
    # the passive party waits for the lost decision (no heartbeat yet), or the active
    # party for lost embeddings: either way the run ends, naming the passive party
    assert eg.group_contains(PartnerStalled) or eg.group_contains(PartnerLost)
    assert "passive" in str(eg.value.exceptions[0])
