"""kopf's index readiness gate, made linear in the objects it waits for.

kopf holds every handler until each object of every indexed kind has been indexed once. Each object's
worker adds a toggle to one ``ToggleSet``, drops it once indexed, then waits for the set to be on; kopf
1.45's set notifies its condition on every add and drop, so every waiting worker (of any watched kind)
wakes on every drop to find the set still off: about N²/2 wake-ups for N objects. A restarted operator
watching 1,000 InferenceDeployments (about 7,000 objects of indexed kinds: the deployments and their
ConfigMaps, Services, StatefulSets, PDBs, volumes and claims; their pods' workers wait too) ran its first
pass 166 s after it started on the 2-core bench machine, 15 s with this (docs/scale.md).

Whether the set is on changes only when a toggle is added, dropped or turned, and a waiter on the set
waits only for that value; a toggle added or dropped changes no other toggle's value. So notifying on an
add or a drop only when it changed the set's value wakes the same waiters for the same reasons, once.
A toggle turned (``Toggle.turn_to``) still notifies as kopf does.
"""

from __future__ import annotations

from collections.abc import Iterable

from kopf._cogs.aiokits import aiotoggles

_ToggleSet = aiotoggles.ToggleSet
_Toggle = aiotoggles.Toggle


async def _make_toggle(self: _ToggleSet, __val: bool = False, *, name: str | None = None) -> _Toggle:
    toggle = _Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        was = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != was:
            self._condition.notify_all()
    return toggle


async def _drop_toggle(self: _ToggleSet, toggle: _Toggle) -> None:
    await _drop_toggles(self, (toggle,))


async def _drop_toggles(self: _ToggleSet, toggles: Iterable[_Toggle]) -> None:
    async with self._condition:
        was = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != was:
            self._condition.notify_all()


def install() -> None:
    """Replace the set's add and drop (idempotent); fails at once if kopf's set is no longer what this
    replaces, rather than leaving the quadratic gate or breaking it quietly."""
    probe = _ToggleSet(all)
    if not (hasattr(probe, "_condition") and hasattr(probe, "_toggles") and isinstance(probe._toggles, set)):
        raise RuntimeError("kopf's ToggleSet changed: review kvtier.controllers.kopfgate against it")
    _ToggleSet.make_toggle = _make_toggle  # type: ignore[method-assign]  # replacing it is this module's purpose
    _ToggleSet.drop_toggle = _drop_toggle  # type: ignore[method-assign]  # as above
    _ToggleSet.drop_toggles = _drop_toggles  # type: ignore[method-assign]  # as above
