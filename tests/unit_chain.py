"""Units of one source stage carried from epoch to epoch in this process, for tests that run
the walker (`regional.dataflow.walker`) directly: unit u is subtask u of every vertex, split
``g<i>`` is assigned at the first epoch to unit ``owners[i] % parallelism``, and each unit's
source positions and operator state bytes go from one epoch to the next."""

from __future__ import annotations

from collections.abc import Sequence

from metadata.model import SplitState, SubtaskState
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.unit_epoch import UnitEpoch
from regional.dataflow.walker import TaskUnit, run_unit_epoch


class UnitChain:
    """The units of `pipeline` (every vertex in each unit) over epochs; the source is `source`."""

    def __init__(
        self, pipeline: Pipeline, parallelism: int, owners: Sequence[int], source: str = "src"
    ) -> None:
        self.vertices = list(pipeline.topological_order())
        self.parallelism = parallelism
        self.owners = list(owners)
        self.source = source
        self.positions: dict[int, tuple[SplitState, ...]] = {u: () for u in range(parallelism)}
        self.blobs: dict[tuple[int, str], bytes] = {}

    def units(self, checkpoint: int) -> list[TaskUnit]:
        """Every unit as restored for `checkpoint` (1: the first, with its new splits)."""
        blobs = self.blobs

        def state_of(s: SubtaskState) -> tuple[bytes, str]:
            return blobs.get((s.index, s.vertex_id), b""), f"state of {s.vertex_id}"

        out = []
        for u in range(self.parallelism):
            new = (
                tuple(
                    (self.source, u, f"g{i}")
                    for i, o in enumerate(self.owners)
                    if o % self.parallelism == u
                )
                if checkpoint == 1
                else ()
            )
            restore = {
                v: SubtaskState(v, u, u, split_states=self.positions[u] if v == self.source else ())
                for v in self.vertices
            }
            out.append(TaskUnit(restore, new, (), state_of))
        return out

    def alone(
        self, pipeline: Pipeline, unit: TaskUnit, checkpoint: int, now_ms: int = 0
    ) -> UnitEpoch:
        """`unit`'s epoch `checkpoint` run alone (`run_unit_epoch`)."""
        return run_unit_epoch(
            pipeline,
            unit.restore,
            checkpoint_id=checkpoint,
            new_splits=unit.new_splits,
            ended=(),
            state_of=unit.state_of,
            now_ms=now_ms,
        )

    def keep(self, unit: int, epoch: UnitEpoch) -> None:
        """What unit `unit`'s next epoch restores: the positions and states `epoch` left."""
        self.positions[unit] = epoch.split_states.get(self.source, ())
        self.blobs.update(((unit, v), b) for v, b in epoch.snapshots.items())
