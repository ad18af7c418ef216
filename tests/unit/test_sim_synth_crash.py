"""sim.faults.synth_crash: the coordinator's crash observer fires at its point only."""

from __future__ import annotations

import asyncio

from sim.faults.synth_crash import crash_at, main


def test_observer_kills_only_at_the_named_point() -> None:
    fired: list[str] = []
    obs = crash_at("round:select@collected", pause_s=0.0, kill=lambda: fired.append("k"))

    async def go() -> None:
        for p in ("schema@collected", "round:select@planned", "round:select@collected",
                  "round:select@unmask"):
            await obs(p)
            if fired:
                fired.append(p)
                return

    asyncio.run(go())
    assert fired == ["k", "round:select@collected"]


def test_no_point_means_no_fault() -> None:
    fired: list[str] = []
    for point in (None, ""):
        obs = crash_at(point, pause_s=0.0, kill=lambda: fired.append("k"))
        asyncio.run(obs("schema@collected"))
    assert fired == []


def test_only_the_coordinator_role_is_accepted(capsys) -> None:
    assert main(["parties", "--ids", "p000"]) == 2
    assert "coordinator" in capsys.readouterr().err
