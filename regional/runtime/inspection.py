"""A regional job's checkpoints as people see them: the inspector views with unit names.

`metadata` reads checkpoints without knowing regional's naming rule or its split enumerators'
snapshots (DESIGN §3: it imports nothing of ours). This module supplies both, from the newest
checkpoint alone (so after the job ended too): `checkpoint_unit_names` (the one naming rule,
`regional.graph.unit_names`), `source_last_assigned` (what each source subtask was given
last), and `job_inspector`, a `metadata.inspect.Inspector` over a job root whose `lag()` has
the `unit_name`, `records_behind` and `seconds_behind` columns `regional inspect ROOT lag
--json` prints (``job_inspector(JobStorage.open(root)).lag()``; `tests/test_inspect.py` checks
it against the command).
"""

from __future__ import annotations

from collections.abc import Sequence

from metadata.events import CheckpointEvent, read_events
from metadata.inspect import Inspector
from metadata.model import CheckpointMetadata
from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from regional.coordinator.split_enumerator import last_assigned
from regional.graph.unit_names import UnitNames, names_of_subtasks

__all__ = ["checkpoint_unit_names", "job_inspector", "source_last_assigned", "unit_labels"]


def source_last_assigned(checkpoint: CheckpointMetadata) -> dict[tuple[str, int], tuple[str, ...]]:
    """Per source subtask (vertex, index), the splits it was given last, from the split
    enumerators' snapshots in `checkpoint` (a finished split leaves the subtask's state, not
    the enumerator's): what a subtask whose splits all finished read last."""
    return {
        (vertex_id, index): splits
        for vertex_id, data in checkpoint.coordinators.items()
        for index, splits in (last_assigned(data) or {}).items()
    }


def checkpoint_unit_names(checkpoint: CheckpointMetadata) -> UnitNames:
    """The units' names (`regional.graph.unit_names`) as `checkpoint` records them: its
    subtasks' units, its sources found from their split enumerators' snapshots (a finished
    source holds no split) or the splits they hold."""
    sources = {v for v, data in checkpoint.coordinators.items() if last_assigned(data) is not None}
    sources |= {s.vertex_id for s in checkpoint.subtasks if s.split_states}
    return names_of_subtasks(
        ((s.vertex_id, s.index, s.unit_id) for s in checkpoint.subtasks), sources
    )


def job_inspector(
    storage: JobStorage,
    *,
    num_retained: int | None = None,
    store: CompletedCheckpointStore | None = None,
    events: Sequence[CheckpointEvent] | None = None,
) -> Inspector:
    """An `Inspector` over the job under `storage` with its event log (events that do not
    decode are skipped: `read_events` reports them), its units' names and its sources' last
    assignments from the newest completed checkpoint; `store` and `events` when the caller
    has loaded them already."""
    store = CompletedCheckpointStore.load(storage) if store is None else store
    events = read_events(storage)[0] if events is None else events
    newest = store.latest()
    if newest is None:
        return Inspector(store, num_retained=num_retained, events=events)
    return Inspector(
        store,
        num_retained=num_retained,
        events=events,
        last_assigned=source_last_assigned(newest),
        names=unit_labels(newest),
    )


def unit_labels(checkpoint: CheckpointMetadata) -> dict[int, str]:
    """Every unit of `checkpoint` (those of its subtasks and of its unit records) -> its name
    (`checkpoint_unit_names`; ``unit <id>`` for a unit with no input subtask)."""
    names = checkpoint_unit_names(checkpoint)
    units = {s.unit_id for s in checkpoint.subtasks} | {u.unit_id for u in checkpoint.units}
    return {u: names[u] for u in sorted(units)}
