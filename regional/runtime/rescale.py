"""Map a checkpoint's state onto a pipeline of another shape (DESIGN §4 rule 12). Pure.

A restore may find the pipeline with other parallelism than the checkpoint recorded. The state
moves like this:

* **splits** (a source subtask's open splits with their positions) stay on their subtask index
  when it still exists; the splits of removed subtasks go, one by one, to the new subtask
  holding the fewest. Finished splits (gone from `split_states`, but still owning keyed state
  downstream) are placed by the same rule, counted separately.
* **split-scoped keyed state** moves with its split: with forward edges, operator subtask *i*
  only holds state of the splits source subtask *i* read, so the keyed state of split *s* goes to
  the subtask that now owns *s*.
* **subtask list state** is dealt round-robin over the new subtasks, list by list, in the order
  of the old subtasks (sizes differ by at most one; every entry kept exactly once); except a
  window operator's fired watermark (`regional.dataflow.window_operator.FIRED_WATERMARK`): every
  new subtask starts from the lowest of the old subtasks', so no record is judged against a
  watermark its own key never reached (with the default `hold`, every record still to come
  has an origin watermark at or above its old subtask's, DESIGN §4 rule 15).
* **union state** does not exist: the state API offers none (DESIGN §4 rule 13 rejects it in
  regional mode).
* **committables** of the checkpoint's fresh sink subtasks are kept (the restore re-commits
  them); those of fallback subtasks were committed under their owner's id and are dropped.

What cannot be mapped — a vertex the pipeline no longer has, a changed max parallelism, state a
vertex can no longer hold — is a `RestoreError` naming the vertex, unless the caller allows
dropping that state (then it is listed in `RestorePlan.dropped`). A vertex whose parallelism
and max parallelism are unchanged keeps its subtasks' state verbatim.

>>> from metadata.model import CheckpointMetadata, SplitState, SubtaskState, VertexInfo
>>> md = CheckpointMetadata(checkpoint_id=4, job_id="j", kind="global", trigger_time_ms=0,
...     completion_time_ms=0, vertices=(VertexInfo("src", 3, 128),), subtasks=tuple(
...     SubtaskState("src", i, i, split_states=(SplitState(f"s{i}", b""),)) for i in range(3)))
>>> plan = plan_restore(md, [VertexShape("src", 2, 128, source=True)],
...                     split_owners={"src": {"s0": 0, "s1": 1, "s2": 2}})
>>> plan.assignments
{'src': {'s0': 0, 's1': 1, 's2': 0}}
>>> [[s.split_id for s in t.split_states] for t in plan.subtasks]
[['s0', 's2'], ['s1']]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from metadata.model import CheckpointMetadata, SplitState, SubtaskState
from metadata.watermarks import MIN_WATERMARK
from regional.dataflow.partitioning import partition_of
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.window_operator import FIRED_WATERMARK
from regional.errors import RestoreError

__all__ = [
    "RestorePlan",
    "SubtaskPlan",
    "VertexShape",
    "deal",
    "place_splits",
    "plan_restore",
    "redistribute_keys",
    "redistribute_state",
]


class VertexShape(msgspec.Struct, frozen=True):
    """A vertex of the pipeline being restored: its size and what state it can hold."""

    vertex_id: str
    parallelism: int
    max_parallelism: int
    source: bool = False
    stateful: bool = False  # keeps operator state (keyed and list state)
    sink: bool = False


class SubtaskPlan(msgspec.Struct, frozen=True):
    """What one new subtask starts from: its open splits and the committables it carries."""

    vertex_id: str
    index: int
    split_states: tuple[SplitState, ...] = ()
    committables: tuple[bytes, ...] = ()


class RestorePlan(msgspec.Struct, frozen=True):
    """How a checkpoint maps onto the pipeline.

    `state_mode[vertex]` says what a stateful vertex's subtasks start from: ``"copy"`` (subtask
    *i* takes old subtask *i*'s state verbatim), ``"redistribute"`` (`redistribute_state` over
    every old subtask) or ``"empty"``. `assignments[source]` maps every split the source
    knows to its new subtask index: per source, since two sources may name splits alike
    (every keyed exchange with N partitions reads splits ``n<N>-p<q>``). `dropped` explains
    every piece of state left behind (allowed by the caller).
    """

    subtasks: tuple[SubtaskPlan, ...]
    state_mode: dict[str, str]
    assignments: dict[str, dict[str, int]]
    dropped: tuple[str, ...] = ()
    rescaled: tuple[str, ...] = ()  # "vertex: 4 -> 2" for every vertex whose size changed
    reset: frozenset[str] = frozenset()  # vertices of the pipeline whose state was dropped
    moved: tuple[str, ...] = ()  # exchange backlogs carried into a new layout or job root

    def placement(self, sources: Iterable[str], *, holder: str) -> dict[str, int]:
        """Where the splits of `sources` now live, for split-scoped state of vertex `holder`
        (which reads them through forward edges): one map, refused (`RestoreError`) when two
        of them name a split alike and place it on different subtasks, since the state of
        `holder` keeps splits by id and could not be told apart.

        >>> RestorePlan((), {}, {"a": {"s": 0}, "b": {"t": 1}}).placement("ab", holder="op")
        {'s': 0, 't': 1}
        """
        out: dict[str, int] = {}
        where: dict[str, str] = {}
        for source in sources:
            for split, index in self.assignments.get(source, {}).items():
                if out.setdefault(split, index) != index:
                    raise RestoreError(
                        f"vertex {holder!r} keeps state by split, and sources "
                        f"{where[split]!r} and {source!r} both read a split named {split!r}, "
                        f"which the new parallelism places on subtasks {out[split]} and "
                        f"{index}; restore with the parallelism the checkpoint was written "
                        f"with, or give the two sources of {holder!r} the same parallelism"
                    )
                where.setdefault(split, source)
        return out


def place_splits(held: Mapping[int, Sequence[str]], parallelism: int) -> dict[str, int]:
    """New subtask index per split: a split stays when its old index still exists; the splits
    of removed subtasks go one by one (old index order) to the subtask holding the fewest (the
    lowest index on ties).

    >>> place_splits({0: ["a"], 1: ["b"], 2: ["c", "d"], 3: ["e"]}, 2)
    {'a': 0, 'b': 1, 'c': 0, 'd': 1, 'e': 0}
    """
    if parallelism < 1:
        raise ValueError(f"parallelism {parallelism} must be at least 1")
    out: dict[str, int] = {}
    count = [0] * parallelism
    moved: list[str] = []
    for index in sorted(held):
        for split in held[index]:
            if index < parallelism:
                out[split] = index
                count[index] += 1
            else:
                moved.append(split)
    for split in moved:
        target = min(range(parallelism), key=lambda i: (count[i], i))
        out[split] = target
        count[target] += 1
    return out


def deal(items: Iterable[Any], parallelism: int) -> list[list[Any]]:
    """Item *k* to subtask *k mod parallelism*: sizes differ by at most one.

    >>> deal("abcde", 2)
    [['a', 'c', 'e'], ['b', 'd']]
    """
    out: list[list[Any]] = [[] for _ in range(parallelism)]
    for k, item in enumerate(items):
        out[k % parallelism].append(item)
    return out


def redistribute_state(
    old: Sequence[OperatorState], assignment: Mapping[str, int], parallelism: int
) -> list[OperatorState]:
    """The state of `parallelism` new subtasks from the old subtasks' states (index order).

    Keyed state of split *s* goes to `assignment[s]` (a split the assignment does not know
    stays at its old index modulo `parallelism`); list state is dealt round-robin, list by list.
    Raises `RestoreError` if two old subtasks hold keyed state of the same split.
    """
    new = [OperatorState() for _ in range(parallelism)]
    holder: dict[str, int] = {}
    for index, state in enumerate(old):
        for split, keyed in state.keyed.items():
            if split in holder:
                raise RestoreError(
                    f"keyed state of split {split!r} is held by subtasks {holder[split]} and "
                    f"{index}; a split's state must live in one subtask, so the checkpoint is "
                    "inconsistent; restore from another checkpoint"
                )
            holder[split] = index
            new[assignment.get(split, index % parallelism)].keyed[split] = keyed
    _deal_lists(old, new)
    return new


def redistribute_keys(old: Sequence[OperatorState], parallelism: int) -> list[OperatorState]:
    """The state of `parallelism` new subtasks of an operator after a keyed exchange: every
    key's state goes to subtask `partition_of(key, parallelism)` (where the exchange now sends
    the key's records); list state is dealt round-robin.

    >>> old = [OperatorState({"": {k: {"n": k}}}) for k in ("a", "b", "d")]
    >>> [sorted(s.keyed.get("", {})) for s in redistribute_keys(old, 2)]
    [['d'], ['a', 'b']]
    """
    new = [OperatorState() for _ in range(parallelism)]
    for index, state in enumerate(old):
        for split, slots in state.keyed.items():
            if split != KEY_SCOPE:
                raise RestoreError(
                    f"subtask {index} holds state of split {split!r} where only key-scoped state "
                    "is expected (the operator reads a keyed exchange); the checkpoint was written "
                    "by another pipeline: restore with the pipeline that wrote it"
                )
            for key, slot in slots.items():
                new[partition_of(key, parallelism)].keyed.setdefault(KEY_SCOPE, {})[key] = slot
    _deal_lists(old, new)
    return new


def _deal_lists(old: Sequence[OperatorState], new: Sequence[OperatorState]) -> None:
    """Subtask list state of `old`, dealt round-robin over `new`, list by list (a window
    operator's fired watermark: the lowest, to every new subtask)."""
    names = list(dict.fromkeys(name for state in old for name in state.lists))
    for name in names:
        entries = [e for state in old for e in state.lists.get(name, ())]
        if name == FIRED_WATERMARK:  # the lowest: keys of every old subtask may land anywhere
            for state in new:
                state.lists[name] = [min(entries, default=MIN_WATERMARK)]
            continue
        for index, part in enumerate(deal(entries, len(new))):
            new[index].lists[name] = part


def plan_restore(
    metadata: CheckpointMetadata,
    vertices: Sequence[VertexShape],
    *,
    split_owners: Mapping[str, Mapping[str, int]] | None = None,
    allow_dropped_state: bool = False,
) -> RestorePlan:
    """Map `metadata` onto a pipeline with `vertices`.

    `split_owners[source]` maps every split the source's enumerator handed out (open or
    finished) to the old subtask index that owns it; splits only found in `split_states` are
    added. Raises `RestoreError` for state that cannot be mapped unless `allow_dropped_state`.
    """
    cid = metadata.checkpoint_id
    old_info = {v.vertex_id: v for v in metadata.vertices}
    new_info = {v.vertex_id: v for v in vertices}
    by_vertex: dict[str, list[SubtaskState]] = {}
    for s in metadata.subtasks:
        by_vertex.setdefault(s.vertex_id, []).append(s)
    for states in by_vertex.values():
        states.sort(key=lambda s: s.index)
    problems: list[str] = []
    dropped_vertices: set[str] = set()

    for vertex_id in sorted(set(by_vertex) | set(old_info)):
        if vertex_id not in new_info and _holds_state(by_vertex.get(vertex_id, ())):
            problems.append(
                f"vertex {vertex_id!r} has state in checkpoint {cid} but the pipeline has no "
                "such vertex (renamed or removed?)"
            )
    for v in vertices:
        old = old_info.get(v.vertex_id)
        states = by_vertex.get(v.vertex_id, [])
        if old is None or not _holds_state(states):
            continue
        why = None
        if old.max_parallelism != v.max_parallelism:
            why = (
                f"vertex {v.vertex_id!r} had max parallelism {old.max_parallelism} in checkpoint "
                f"{cid}, the pipeline has {v.max_parallelism}"
            )
        elif any(s.split_states for s in states) and not v.source:
            why = f"vertex {v.vertex_id!r} read source splits in checkpoint {cid}, now reads none"
        elif any(s.handles for s in states) and not v.stateful:
            why = f"vertex {v.vertex_id!r} kept operator state in checkpoint {cid}, now keeps none"
        if why is not None:
            problems.append(why)
            dropped_vertices.add(v.vertex_id)
    if problems and not allow_dropped_state:
        raise RestoreError(
            f"cannot map checkpoint {cid} onto the pipeline: {'; '.join(problems)}. Restore "
            "with the pipeline that wrote it, or allow dropping that state "
            "(--allow-dropped-state / allow_dropped_state=True)"
        )

    assignments: dict[str, dict[str, int]] = {}
    for v in vertices:
        if not v.source or v.vertex_id in dropped_vertices or v.vertex_id not in old_info:
            continue
        owners = dict((split_owners or {}).get(v.vertex_id, {}))
        open_ = {
            s.split_id: st.index for st in by_vertex.get(v.vertex_id, ()) for s in st.split_states
        }
        finished = {k: i for k, i in owners.items() if k not in open_}
        assignment = assignments.setdefault(v.vertex_id, {})
        for part in (open_, finished):
            held: dict[int, list[str]] = {}
            for split, index in part.items():
                held.setdefault(index, []).append(split)
            assignment.update(place_splits(held, v.parallelism))

    subtasks: list[SubtaskPlan] = []
    state_mode: dict[str, str] = {}
    rescaled: list[str] = []
    for v in vertices:
        old = old_info.get(v.vertex_id)
        states = [] if v.vertex_id in dropped_vertices else by_vertex.get(v.vertex_id, [])
        if old is not None and old.parallelism != v.parallelism:
            rescaled.append(f"{v.vertex_id}: {old.parallelism} -> {v.parallelism}")
        if v.stateful:
            if not any(s.handles for s in states):
                state_mode[v.vertex_id] = "empty"
            elif old is not None and old.parallelism == v.parallelism:
                state_mode[v.vertex_id] = "copy"
            else:
                state_mode[v.vertex_id] = "redistribute"
        splits: list[list[SplitState]] = [[] for _ in range(v.parallelism)]
        for st in states:
            for split_state in st.split_states:
                splits[assignments[v.vertex_id][split_state.split_id]].append(split_state)
        commits: list[list[bytes]] = [[] for _ in range(v.parallelism)]
        for st in states:
            if st.ref_checkpoint_id is None and st.committables:
                commits[st.index % v.parallelism].extend(st.committables)
        subtasks += [
            SubtaskPlan(v.vertex_id, i, tuple(splits[i]), tuple(commits[i]))
            for i in range(v.parallelism)
        ]
    return RestorePlan(
        tuple(subtasks),
        state_mode,
        assignments,
        tuple(f"dropped: {p}" for p in problems),
        tuple(rescaled),
        frozenset(dropped_vertices),
    )


def _holds_state(states: Iterable[SubtaskState]) -> bool:
    return any(s.handles or s.split_states or s.committables for s in states)
