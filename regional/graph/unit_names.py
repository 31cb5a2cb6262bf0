"""One naming rule for fallback units and source positions: a unit is shown as what it reads.

A fallback unit (DESIGN §2) is named by its *input* subtasks, the subtasks of its vertices that
read: sources and the readers of a keyed exchange. An input subtask ``(vertex, index)`` is
``vertex[index]``, so a unit reading split or subtask 1 of source ``orders`` is ``orders[1]``
and one reading partition 0 of the exchange ``by-customer`` is ``by-customer[0]``. A join's
unit reads both its sides' exchange readers (``<join>-left`` and ``<join>-right``, partition
q): it is ``<left>⨝<right>[q]``, each side named by what feeds its exchange
(``orders⨝payments[3]``), or the join's own vertex name (``paid[3]``) when that does not tell
the units apart (two joins of the same inputs, a side fed by several sources). A unit with
several other inputs joins their names with ``+``; one with none is ``unit <id>``.

The rule needs only which subtasks each unit holds and which vertices read, so it is derived
the same way from a pipeline's region plan while the job runs (`names_of_plan`) and from a
checkpoint's metadata after it ended (the caller says which vertices are sources, from the
split enumerators' snapshots). `UnitNames.resolve` turns a name back into the unit id
(`regional.runtime.faults.Faults` takes either).

>>> units = {0: [("orders", 0), ("paid-left-writer", 0)],
...          1: [("orders", 1), ("paid-left-writer", 1)],
...          2: [("payments", 0), ("paid-right-writer", 0)],
...          3: [("paid-left", 0), ("paid-right", 0), ("paid", 0)]}
>>> names = unit_names(units, sources={"orders", "payments"})
>>> names.labels
{0: 'orders[0]', 1: 'orders[1]', 2: 'payments[0]', 3: 'orders⨝payments[0]'}
>>> names.resolve("orders[1]"), names.resolve("paid[0]"), names.resolve(2)
(1, 3, 2)
>>> names.mention(3), names.mention(7)
('orders⨝payments[0] (unit 3)', 'unit 7')

Positions are shown in the source's own terms (`split_text`, `position_text`), from the split
id's shape alone (inspection runs without the pipeline): ``<topic>:<partition>`` is a Kafka
partition, ``n<layout>-p<q>`` a keyed exchange's partition, anything else a file (or another
source's split) whose position counts the rows before it.

>>> split_text("clicks:3"), position_text("clicks:3", "20", 2)
('clicks partition 3', 'clicks partition 3 offset 20 + record 2')
>>> position_text("orders-03.jsonl", "7", 0), position_text("orders-03.jsonl", "", 4)
('file orders-03.jsonl line 8', 'file orders-03.jsonl line 1 + record 4')
>>> split_text("n4-p1", "by-customer"), position_text("n4-p1", "5:1:0", 20, "by-customer")
('by-customer partition 1', 'by-customer partition 1 after checkpoint 5 writer 1 row 0 + record 20')
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence

from regional.errors import RegionalError
from regional.graph.regions import RegionPlan

__all__ = [
    "JOIN",
    "WRITER_SUFFIX",
    "UnitNameError",
    "UnitNames",
    "at_text",
    "exchange_readers",
    "names_of_plan",
    "names_of_subtasks",
    "position_text",
    "split_text",
    "unit_names",
]

#: The sign between a join's two sides in a unit's name.
JOIN = "⨝"
#: A keyed exchange's writer vertex is its reader's id with this suffix (`Pipeline.key_by`).
WRITER_SUFFIX = "-writer"
_SIDES = ("-left", "-right")
_KAFKA = re.compile(r"(.+):(\d+)")
_EXCHANGE = re.compile(r"n(\d+)-p(\d+)")
_CURSOR = re.compile(r"(\d+):(\d+):(\d+)")


class UnitNameError(RegionalError, ValueError):
    """A unit named by a name no unit of the job has."""


def exchange_readers(vertices: Iterable[str]) -> set[str]:
    """The vertices that read a keyed exchange: those with a ``<id>-writer`` vertex."""
    ids = set(vertices)
    return {v[: -len(WRITER_SUFFIX)] for v in ids if v.endswith(WRITER_SUFFIX)} & ids


@dataclasses.dataclass(frozen=True)
class UnitNames:
    """The units' names (`labels`: unit id -> name) and what else names a unit (`aliases`:
    each input subtask ``vertex[index]`` it holds, and a join unit's ``join[q]``)."""

    labels: Mapping[int, str]
    aliases: Mapping[str, int]
    #: unit -> the keyed exchange it reads, named by its reader (a join's: the join vertex)
    exchanges: Mapping[int, str] = dataclasses.field(default_factory=dict)

    def mention(self, unit: int) -> str:
        """The unit in running text, by name and id (the id is what the grid and the
        fallback lists show): ``orders[1] (unit 1)``; ``unit 5`` for one without a name."""
        label = self.labels.get(unit)
        return (
            f"unit {unit}" if label is None or label == f"unit {unit}" else f"{label} (unit {unit})"
        )

    def reads_text(self, unit: int, split_id: str) -> str:
        """A split unit `unit` reads, in its source's terms (`split_text`)."""
        return split_text(split_id, self.exchanges.get(unit))

    def __getitem__(self, unit: int) -> str:
        """The name of `unit` (``unit <id>`` for one the job does not have)."""
        return self.labels.get(unit, f"unit {unit}")

    def resolve(self, unit: int | str) -> int:
        """The unit id a `Faults` entry (or a user) names: an id, a unit's name (``orders[1]``,
        ``orders⨝payments[3]``) or an alias (``paid[3]``, ``paid-left[3]``). An unknown name
        raises `UnitNameError` listing the names there are."""
        if isinstance(unit, int):
            return unit
        text = unit.strip()
        if text.isdigit():
            return int(text)
        by_label = {label: u for u, label in self.labels.items()}
        if text in by_label:
            return by_label[text]
        if text in self.aliases:
            return self.aliases[text]
        known = sorted(self.labels.values())
        shown = ", ".join(known[:20]) + (f" (+{len(known) - 20} more)" if len(known) > 20 else "")
        raise UnitNameError(
            f"no unit named {unit!r}; the job's units are {shown or 'none'} (or give a unit id; "
            "`regional regions` lists them)"
        )


def unit_names(
    units: Mapping[int, Sequence[tuple[str, int]]], *, sources: Collection[str]
) -> UnitNames:
    """Each unit's name by the rule of the module docstring, and its aliases. `units` maps a
    unit id to its subtasks ``(vertex, index)`` (every vertex of the unit, so the writers of
    an exchange say what feeds it); `sources` are the source vertices (the exchange readers
    are found from the writers)."""
    vertices = {v for members in units.values() for v, _ in members}
    readers = exchange_readers(vertices)
    inputs = set(sources) | readers
    reads = {u: sorted((v, i) for v, i in m if v in inputs) for u, m in units.items()}
    base = {u: _plain(r) for u, r in reads.items()}  # the input vertex, when there is one
    feeds: dict[str, set[str]] = defaultdict(set)  # exchange reader -> what feeds its writer
    for u, members in units.items():
        for v, _ in members:
            if v.endswith(WRITER_SUFFIX) and v[: -len(WRITER_SUFFIX)] in readers:
                feeds[v[: -len(WRITER_SUFFIX)]].add(base[u] or f"unit {u}")
    labels: dict[int, str] = {}
    aliases: dict[str, int] = {}
    exchanges: dict[int, str] = {}
    joined: dict[int, str] = {}  # unit -> its join's vertex name, for a label that collides
    for u, r in sorted(reads.items()):
        for v, i in r:
            aliases.setdefault(f"{v}[{i}]", u)
        side = _join_sides(r, readers)
        if side is not None:
            join, q = side
            joined[u] = f"{join}[{q}]"
            exchanges[u] = join
            aliases.setdefault(joined[u], u)
            left, right = (_side_name(join + s, feeds) for s in _SIDES)
            labels[u] = f"{left}{JOIN}{right}[{q}]"
        elif r:
            labels[u] = "+".join(f"{v}[{i}]" for v, i in r)
            if (one := base[u]) in readers:
                exchanges[u] = one
        else:
            labels[u] = f"unit {u}"
    seen: dict[str, int] = defaultdict(int)
    for label in labels.values():
        seen[label] += 1
    for u, name in joined.items():
        if seen[labels[u]] > 1:
            labels[u] = name
    return UnitNames(labels, aliases, exchanges)


def _plain(reads: Sequence[tuple[str, int]]) -> str | None:
    """The one vertex a unit reads, or None (several, or none)."""
    names = {v for v, _ in reads}
    return names.pop() if len(names) == 1 else None


def _join_sides(reads: Sequence[tuple[str, int]], readers: set[str]) -> tuple[str, int] | None:
    """(join vertex, partition) when a unit reads exactly both sides of one join's exchange."""
    if len(reads) != 2:
        return None
    (a, i), (b, j) = reads
    if i != j or a not in readers or b not in readers:
        return None
    for join in {a[: -len(s)] for s in _SIDES if a.endswith(s)}:
        if {a, b} == {join + s for s in _SIDES}:
            return join, i
    return None


def _side_name(reader: str, feeds: Mapping[str, set[str]]) -> str:
    """What feeds a join side's exchange (its one upstream input vertex), else the reader."""
    upstream = feeds.get(reader, set())
    return next(iter(upstream)) if len(upstream) == 1 else reader


def names_of_subtasks(
    subtasks: Iterable[tuple[str, int, int]], sources: Collection[str]
) -> UnitNames:
    """`unit_names` of (vertex, index, unit id) triples, e.g. a checkpoint's subtasks."""
    units: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for vertex, index, unit in subtasks:
        units[unit].append((vertex, index))
    return unit_names(units, sources=sources)


def names_of_plan(plan: RegionPlan) -> UnitNames:
    """`unit_names` of a pipeline's region plan (the graph's sources; its exchange readers
    are sources there too, and found by their writers either way)."""
    sources = {v.id for v in plan.graph.vertices if v.kind == "source"}
    units = {u: [(s.vertex_id, s.index) for s in m] for u, m in enumerate(plan.units)}
    return unit_names(units, sources=sources)


def split_text(split_id: str, exchange: str | None = None) -> str:
    """A split in its source's terms: ``clicks partition 3`` (Kafka), ``<exchange> partition
    1`` (a keyed exchange, named by its reader when known), the file name otherwise."""
    if m := _EXCHANGE.fullmatch(split_id):
        return f"{exchange or 'exchange'} partition {m[2]}"
    if m := _KAFKA.fullmatch(split_id):
        return f"{m[1]} partition {m[2]}"
    return split_id


def position_text(
    split_id: str, position: str, record: int | None = None, exchange: str | None = None
) -> str:
    """Where in `split_id` a record was: the split in its source's terms (`split_text`; a
    file as ``file <name>``), then `at_text`."""
    where = split_text(split_id, exchange)
    if not (_EXCHANGE.fullmatch(split_id) or _KAFKA.fullmatch(split_id)) and (
        "." in split_id or "/" in split_id
    ):
        where = f"file {split_id}"
    return f"{where} {at_text(split_id, position, record)}"


def at_text(split_id: str, position: str, record: int | None = None) -> str:
    """Where in its split a record was: at `position` (the one its epoch started at, as
    text), then the `record`-th record read after it (0: the first). A Kafka position is an
    offset (``offset 20 + record 2``: the third record the operator got from offset 20 on,
    offset 22 unless the partition has gaps or an operator before dropped records); a file's
    counts the rows before it (``line 8 + record 2``, likewise; a split id with a ``.`` or
    ``/`` is a file); an exchange's is a cursor (``after checkpoint 5 writer 1 row 0``); any
    other split's is shown as it is (``position 20 + record 2``, ``start``). Only what is
    known is said: no offset is guessed.

    >>> at_text("events:1", "20/90", 2), at_text("events:1", ""), at_text("n2-p0", "", 3)
    ('offset 20 + record 2', 'start', 'from the start + record 3')
    >>> at_text("g0", "", 13), at_text("g0", "40", 1)
    ('start + record 13', 'position 40 + record 1')
    """
    plus = "" if not record else f" + record {record}"
    if _EXCHANGE.fullmatch(split_id):
        m = _CURSOR.fullmatch(position)
        at = f"after checkpoint {m[1]} writer {m[2]} row {m[3]}" if m else "from the start"
        return f"{at}{plus}"
    if _KAFKA.fullmatch(split_id):
        offset = position.split("/")[0] if position else ""
        return f"offset {offset}{plus}" if offset.isdigit() else f"start{plus}"
    if "." not in split_id and "/" not in split_id:  # not a file: a generator's range, ...
        return f"position {position}{plus}" if position else f"start{plus}"
    rows = int(position) if position.isdigit() else 0
    return f"line {rows + 1}{plus}"
