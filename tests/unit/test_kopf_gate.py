"""kopf's index readiness gate, as kvtier installs it: the same gate, one wake-up instead of one per object."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits import aiotoggles

from kvtier.controllers import kopfgate

OBJECTS = 2_000


async def _gate(objects: int) -> tuple[int, list[int]]:
    """kopf's pattern (processing.py): a blocker toggle, then per object: add a toggle, drop it once indexed,
    wait for the set to be on. Returns the notifications sent and how many objects passed before the blocker
    dropped (none may)."""
    ready = aiotoggles.ToggleSet(all)
    notified = 0
    notify_all = ready._condition.notify_all

    def counting() -> None:
        nonlocal notified
        notified += 1
        notify_all()

    ready._condition.notify_all = counting  # type: ignore[method-assign]  # counts kopf's own notifications
    blocker = await ready.make_toggle(name="blocker")  # the empty set was on: this one turns it off
    notified = 0
    passed: list[int] = []

    async def worker(index: int) -> None:
        toggle = await ready.make_toggle(name=str(index))
        await asyncio.sleep(0)
        await ready.drop_toggle(toggle)
        await ready.wait_for(True)
        passed.append(index)

    workers = [asyncio.create_task(worker(index)) for index in range(objects)]
    for _ in range(5):
        await asyncio.sleep(0)
    early = list(passed)
    before = notified
    await ready.drop_toggle(blocker)
    await asyncio.wait_for(asyncio.gather(*workers), 60)
    assert sorted(passed) == list(range(objects))
    return before, early


def test_the_gate_holds_every_object_until_the_last_is_indexed_and_wakes_the_waiters_once():
    kopfgate.install()
    notified_before_the_blocker, early = asyncio.run(_gate(OBJECTS))
    assert early == [], "an object passed the gate before every kind was listed"
    assert notified_before_the_blocker == 0, f"{notified_before_the_blocker} wake-ups while the set stayed off"


def test_a_toggle_turned_still_wakes_its_waiters_and_a_set_of_any_still_flips():
    kopfgate.install()

    async def scenario() -> None:
        paused = aiotoggles.ToggleSet(any)
        toggle = await paused.make_toggle(name="peering")
        resumed = asyncio.create_task(paused.wait_for(True))
        await asyncio.sleep(0)
        assert not resumed.done()
        await toggle.turn_to(True)
        await asyncio.wait_for(resumed, 5)
        cleared = asyncio.create_task(paused.wait_for(False))
        await asyncio.sleep(0)
        await paused.drop_toggle(toggle)  # the set's value flips to off: its waiters wake
        await asyncio.wait_for(cleared, 5)

    asyncio.run(scenario())


def test_install_is_idempotent_and_checks_what_it_replaces(monkeypatch):
    kopfgate.install()
    kopfgate.install()
    assert aiotoggles.ToggleSet.drop_toggle is kopfgate._drop_toggle
    monkeypatch.setattr(aiotoggles.ToggleSet, "__init__", lambda self, fn: None)
    try:
        kopfgate.install()
    except RuntimeError as error:
        assert "ToggleSet changed" in str(error)
    else:
        raise AssertionError("a changed ToggleSet was patched anyway")
