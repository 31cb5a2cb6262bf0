"""Timers of a keyed `process`: ``ctx.timers.at_event_time(ts)`` and ``at_processing_time(ts)``
call ``on_timer(ctx, ts)`` for the key once the watermark (or the processing time) reaches `ts`.

Timers are keyed state: they live in the key's slot (under `TIMERS`), so they are snapshotted,
fall back, restore and rescale with it. Per epoch, after the records, every event-time timer of
a scope at or below the scope's watermark fires, in (time, key) order, deterministically; a
timer registered by `on_timer` at or below the watermark fires in the same pass. A record read
behind a timer (origin watermark below it) is always processed before the timer fires.
Processing-time timers fire after them, at or below the task's clock: they are outside the
determinism rule (DESIGN §4 rule 13), like state TTL.

>>> from regional.dataflow.state import OperatorState
>>> state = OperatorState()
>>> ctx = state.context("s", "alice")
>>> bind(ctx, state, "s", 0)
>>> ctx.timers.at_event_time(5_000); ctx.timers.at_event_time(5_000); ctx.timers.event_times()
[5000]
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.event_time import to_millis
from regional.dataflow.state import KEY_SCOPE, KeyedContext, OperatorState

__all__ = ["TIMERS", "TimerService", "bind", "fire_timers"]

#: The slot entry holding a key's timers: ``{"e": [event times], "p": [processing times]}``.
TIMERS = "\x00timers"
_ENCODE = msgspec.msgpack.Encoder()


class TimerService:
    """The timers of one key (``ctx.timers``)."""

    def __init__(self, slot: dict[Any, Any], watermark: int) -> None:
        self._slot = slot
        #: the watermark of the key's scope at the start of this epoch
        self.watermark = watermark

    def _add(self, kind: str, ts: Any) -> None:
        when = to_millis(ts, "a timer's time")
        timers = self._slot.setdefault(TIMERS, {})
        times = timers.setdefault(kind, [])
        if when not in times:
            times.append(when)
            times.sort()

    def at_event_time(self, ts: Any) -> None:
        """Call `on_timer(ctx, ts)` once the watermark reaches `ts` (a datetime or ms)."""
        self._add("e", ts)

    def at_processing_time(self, ts: Any) -> None:
        """Call `on_timer(ctx, ts)` once the processing time reaches `ts` (not deterministic)."""
        self._add("p", ts)

    def delete(self, ts: Any) -> None:
        """Forget the timers of this key at `ts` (both kinds)."""
        when = to_millis(ts, "a timer's time")
        timers = self._slot.get(TIMERS, {})
        for kind in ("e", "p"):
            if when in timers.get(kind, ()):
                timers[kind].remove(when)
                if not timers[kind]:
                    del timers[kind]
        if TIMERS in self._slot and not timers:
            del self._slot[TIMERS]

    def event_times(self) -> list[int]:
        """The key's pending event-time timers (ms), earliest first."""
        return list(self._slot.get(TIMERS, {}).get("e", ()))

    def processing_times(self) -> list[int]:
        """The key's pending processing-time timers (ms), earliest first."""
        return list(self._slot.get(TIMERS, {}).get("p", ()))


def bind(ctx: KeyedContext, state: OperatorState, scope: str, watermark: int) -> None:
    """Give `ctx` its key's timers (``ctx.timers``)."""
    ctx.timers = TimerService(ctx._slot, watermark)


def _pop(slot: dict[Any, Any], kind: str, ts: int) -> None:
    timers = slot.get(TIMERS, {})
    if ts in timers.get(kind, ()):
        timers[kind].remove(ts)
        if not timers[kind]:
            del timers[kind]
    if TIMERS in slot and not timers:
        del slot[TIMERS]


def fire_timers(
    state: OperatorState,
    time: EpochTime,
    scope_kind: str,
    on_timer: Callable[[KeyedContext, int], Iterable[Any] | None],
) -> tuple[list[tuple[str, list[Any]]], list[int]]:
    """Fire the due timers of every scope (see the module docstring); the output chunks and
    their origin watermarks."""
    out: list[tuple[str, list[Any]]] = []
    origins: list[int] = []
    for scope in list(state.keyed):
        slots = state.keyed[scope]
        watermark = time.end.get(scope)
        if watermark is None:
            continue
        rows: list[Any] = []
        for kind, limit in (("e", watermark), ("p", time.now_ms)):
            heap = [
                (ts, _ENCODE.encode(key), key)
                for key, slot in slots.items()
                if TIMERS in slot
                for ts in slot[TIMERS].get(kind, ())
                if ts <= limit
            ]
            heapq.heapify(heap)
            while heap:
                ts, code, key = heapq.heappop(heap)
                slot = slots.get(key)
                if slot is None or ts not in slot.get(TIMERS, {}).get(kind, ()):
                    continue  # deleted by an earlier timer of this pass
                _pop(slot, kind, ts)
                ctx = state.context(scope, key)
                bind(ctx, state, scope, watermark)
                before = set(
                    ctx.timers.event_times() if kind == "e" else ctx.timers.processing_times()
                )
                rows += list(on_timer(ctx, ts) or ())
                now = ctx.timers.event_times() if kind == "e" else ctx.timers.processing_times()
                for new in set(now) - before:
                    if new <= limit:
                        heapq.heappush(heap, (new, code, key))
                if not slot:
                    del slots[key]
        if rows:
            out.append((scope if scope_kind == "split" else time.key_split, rows))
            origins.append(time.start_of(scope))
    for scope in [s for s, slots in state.keyed.items() if not slots and s != KEY_SCOPE]:
        del state.keyed[scope]
    return out, origins
