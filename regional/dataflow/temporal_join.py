"""The temporal join, as of event time (DESIGN §4 rule 18): each record of a stream joined with
the version of its key that was valid at the record's event time, in a versioned table built
from a keyed changelog stream (upserts and deletes), like Flink's ``FOR SYSTEM_TIME AS OF`` and
Kafka Streams' versioned KTable joins.

Both inputs reach subtask q through durable keyed exchanges partitioned alike, so the stream's
regions and the changelog's fall back on their own (`regional.dataflow.joins.KeyedJoin`). Per
key, keyed state holds the versions (event time, row; None for a delete) in event-time order and
the stream records waiting for their version:

* the version valid at time t is the change with the greatest event time ``<= t``; a delete
  means no version. Of two changes of a key at the same time, the one whose msgpack encoding
  sorts last: a rule of the data, not of arrival order (changes from two input splits arrive
  in another order when one of them fell back), so the rows are the same whatever fell back;
  give changes distinct times (ms) where their order matters;
* a stream record waits until the watermark W passes its time (``ts < W``): every change still
  to come that is not late has a time ``>= W`` (its origin watermark is at least W), so none can
  be valid at ``ts`` any more; then it is emitted with its version, or, with none, dropped
  (``how="inner"``) or emitted with None (``how="left"``);
* the table keeps, per key, every version at or after W and the newest one before W (the one
  valid at W); older versions leave, and a delete that is the newest before W leaves too; at
  the end of the input (W = +inf) every version leaves;
* late records on either side (below their origin watermark) are never joined: counted, and
  with ``on_late="dead-letter"`` dead letters;
* a record whose key is None has no version (``how="left"`` emits it with None at once); a
  change whose key is None is no version of anything; a record or change whose key function
  or ``is_delete`` raises, and a pair whose ``emit`` raises, is a dead letter (or fails its
  unit) as in the interval join (`regional.dataflow.joins`).

>>> spec = TemporalJoinSpec(how="left")
>>> slot = {}
>>> spec.add(slot, stream=[(15, "click at 15")], table=[(10, "gold"), (20, "silver")])
>>> spec.emit_ready(slot, watermark=16)
[('click at 15', 'gold')]
>>> slot["v"]  # the version valid at 16 and the newer one
[[10, 'gold', False], [20, 'silver', False]]
>>> spec.emit_ready(slot, watermark=25), slot["v"]
([], [[20, 'silver', False]])
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from metadata.watermarks import MAX_WATERMARK
from regional.dataflow.building import Build
from regional.dataflow.failures import function_error, function_name
from regional.dataflow.joins import KeyedJoin, NewRows, add_join, join_schema
from regional.errors import GraphError

__all__ = [
    "HOW",
    "TemporalJoin",
    "TemporalJoinSpec",
    "build_temporal_join",
    "default_emit",
    "delete_test",
    "tie_order",
]

#: The kinds of temporal join: a record without a version is dropped, or emitted with None.
HOW = ("inner", "left")
#: slot entries: versions [[ts, change, is a delete], ...] in `add`'s order; waiting records
#: [[ts, record], ...] in arrival order
_VERSIONS, _WAITING = "v", "s"
_ENCODE = msgspec.msgpack.Encoder()


def tie_order(change: Any) -> bytes:
    """What orders two changes of a key at the same event time: their msgpack encoding (their
    repr where msgpack has no encoding for a value)."""
    try:
        return _ENCODE.encode(change)
    except (TypeError, ValueError):
        return repr(change).encode()


def default_emit(record: Any, version: Any) -> dict[str, Any]:
    """The default joined row: ``{"record": record, "version": version}`` (None: no version)."""
    return {"record": record, "version": version}


def delete_test(is_delete: Callable[[Any], Any] | str | None) -> Callable[[Any], bool]:
    """Whether a change is a delete: a function of the change, the name of a field that is true
    for deletes, or None (every change is an upsert).

    >>> delete_test("deleted")({"user": "u1", "deleted": True}), delete_test(None)({})
    (True, False)
    """
    if is_delete is None:
        return lambda change: False
    if isinstance(is_delete, str):
        field = is_delete

        def test(change: Any) -> bool:
            return bool(change.get(field)) if isinstance(change, dict) else False

        test.__qualname__ = f"field {field!r}"  # how errors name it
        return test
    fn = is_delete

    def call(change: Any) -> bool:
        return bool(fn(change))

    call.__qualname__ = function_name(fn)
    return call


class TemporalJoinSpec:
    """The join's kind, output row and delete test; the pure part of the operator on one key's
    slot: adding the epoch's rows (`add`) and emitting what the watermark makes ready
    (`emit_ready`)."""

    def __init__(
        self,
        *,
        how: str = "inner",
        emit: Callable[[Any, Any], Any] | None = None,
        is_delete: Callable[[Any], bool] | None = None,
    ) -> None:
        self.how = how
        self.emit = emit or default_emit
        self.is_delete = is_delete or delete_test(None)

    def add(
        self,
        slot: dict[str, Any],
        *,
        stream: Sequence[tuple[int, Any]],
        table: Sequence[tuple[Any, ...]],
    ) -> None:
        """Add a key's new stream records (waiting) and changes (versions, in time order, and
        of equal times in the order of their encoding: `tie_order`); a change is (time,
        change) or (time, change, whether it is a delete), its `is_delete` known already."""
        if table:
            versions: list[list[Any]] = slot.setdefault(_VERSIONS, [])
            for ts, change, *deleted in table:
                times = [v[0] for v in versions]
                at = bisect.bisect_right(times, ts)
                first = bisect.bisect_left(times, ts)
                if first < at:  # changes at the same time: ordered by their content
                    mine = tie_order(change)
                    while at > first and tie_order(versions[at - 1][1]) > mine:
                        at -= 1
                flag = deleted[0] if deleted else bool(self.is_delete(change))
                versions.insert(at, [ts, change, flag])
        if stream:
            slot.setdefault(_WAITING, []).extend([ts, r] for ts, r in stream)

    def emit_ready(self, slot: dict[str, Any], *, watermark: int) -> list[tuple[Any, Any]]:
        """The (record, version) pairs of the waiting records the `watermark` passed, in
        arrival order, and the versions no record still to come can need dropped."""
        versions: list[list[Any]] = slot.get(_VERSIONS, [])
        times = [v[0] for v in versions]
        out: list[tuple[Any, Any]] = []
        waiting = slot.get(_WAITING)
        if waiting:
            kept = []
            for entry in waiting:
                ts, record = entry
                if ts >= watermark:
                    kept.append(entry)
                    continue
                at = bisect.bisect_right(times, ts)
                version = versions[at - 1][1] if at and not versions[at - 1][2] else None
                if version is not None or self.how == "left":
                    out.append((record, version))
            if kept:
                slot[_WAITING] = kept
            else:
                del slot[_WAITING]
        if versions:
            # the newest version before the watermark is valid at it: keep it and the newer
            first = max(bisect.bisect_left(times, watermark) - 1, 0)
            if versions[first][0] < watermark and (
                versions[first][2] or watermark >= MAX_WATERMARK
            ):
                first += 1  # a delete valid at the watermark (the same as no version), or the
                # end of the input: nothing will need it
            if first:
                del versions[:first]
            if not versions:
                del slot[_VERSIONS]
        return out


class TemporalJoin(KeyedJoin):
    """The temporal join operator (`KeyedStream.temporal_join` adds it): input 0 is the stream,
    input 1 the changelog of the versioned table; `spec` is a `TemporalJoinSpec`."""

    kind = "temporal_join"
    what = "temporal join"
    sides = ("stream", "changelog")
    spec: TemporalJoinSpec

    def user_functions(self) -> tuple[Any, ...]:
        return (*super().user_functions(), self.spec.is_delete)

    def entry(self, side: int, ts: int, record: Any) -> tuple[Any, ...]:
        if side == 0:
            return (ts, record)
        try:
            deleted = bool(self.spec.is_delete(record))
        except Exception as exc:
            raise function_error(
                f"{self.what} {self.name!r} (changelog side)",
                "is_delete",
                self.spec.is_delete,
                record,
                exc,
            ) from exc
        return (ts, record, deleted)

    def join(
        self, slots: dict[Any, dict[Any, Any]], new: NewRows, watermark: int
    ) -> list[tuple[Any, Any]]:
        for key, (stream, table) in new.items():
            self.spec.add(slots[key], stream=stream, table=table)
        pairs: list[tuple[Any, Any]] = []
        for key in list(slots):
            slot = slots[key]
            pairs += self.spec.emit_ready(slot, watermark=watermark)
            if not slot:
                del slots[key]
        return pairs

    def unmatched(self, keyless: tuple[list[Any], list[Any]]) -> list[tuple[Any, Any]]:
        return [(r, None) for r in keyless[0]] if self.spec.how == "left" else []


def build_temporal_join(
    graph: Build,
    stream: Any,
    table: Any,
    *,
    how: str,
    emit: Callable[[Any, Any], Any] | None,
    is_delete: Callable[[Any], Any] | str | None,
    partitions: int | None,
    on_late: str,
    event_time: Callable[[Any], Any] | str | None,
    table_event_time: Callable[[Any], Any] | str | None,
    name: str | None,
) -> str:
    """Add a temporal join of keyed `stream` with the versioned table keyed changelog `table`
    builds (`KeyedStream.temporal_join` says what it does); its vertex id. `GraphError`
    naming the join for any argument it cannot run with."""
    vid = graph.vertex_id("temporal_join", name)
    what = f"temporal join {vid!r}"
    left = graph.keyed(stream, what)
    right = graph.keyed(table, what, want="a keyed changelog stream, e.g. changes.key_by('user')")
    if how not in HOW:
        raise GraphError(f"{what}: how={how!r}; use one of {', '.join(map(repr, HOW))}")
    graph.late_policy(what, on_late)
    if is_delete is not None and not (isinstance(is_delete, str) or callable(is_delete)):
        raise GraphError(
            f"{what}: is_delete={is_delete!r}; give a field name that is true for deletes "
            "or a function of a change"
        )
    spec = TemporalJoinSpec(how=how, emit=emit, is_delete=delete_test(is_delete))
    return add_join(
        graph,
        (left, right),
        lambda keys, times, fields: TemporalJoin(spec, keys, times, fields=fields, on_late=on_late),
        vid=vid,
        times=((event_time, f"{what} (stream)"), (table_event_time, f"{what} (changelog)")),
        partitions=partitions,
        schema=join_schema(graph, (left, right), emit, ("record", "version"), how, what),
    )
