"""What every unit of a job shares in its task (`TaskEnv`), apart from the task that runs them
(`regional.runtime.task`), so the parts of a task can name it without importing the task."""

from __future__ import annotations

from typing import Any

import msgspec

from regional.runtime.faults import UnitFaults
from regional.runtime.hot_state import DEFAULT_HOT_STATE_BYTES
from regional.runtime.state_upload import UploadLatency

__all__ = ["TaskEnv"]


class TaskEnv(msgspec.Struct, frozen=True, dict=True):
    """What every unit of a job shares (shipped once per epoch job): where checkpoints live,
    the pipeline, the per-unit timeout (seconds), the upload pool size and the driver run (its
    id names the state files, so two drivers never write the same file).

    `upload_latency` injects slow storage; `upload_in_sync_phase` uploads inside the unit's
    sync phase instead of the async thread pool (both for benchmarks, off by default).

    `hot_state` (on by default) keeps the operator states a unit acked decoded in the worker
    process, so the unit's next epoch there restores them without decoding when the
    coordinator names exactly the state they encode (`regional.runtime.hot_state`, DESIGN §6);
    `hot_state_bytes` bounds them (counted at their snapshots' sizes)."""

    root: str
    job_id: str
    pipeline: Any  # regional.dataflow.pipeline.Pipeline (cloudpickled with the task)
    unit_timeout: float
    upload_threads: int = 2
    upload_latency: UploadLatency | None = None
    upload_in_sync_phase: bool = False
    faults: UnitFaults | None = None  # injected unit faults (tests, demos); None in production
    #: event time: release an exchange writer that fell back this many checkpoints in a row
    #: (the `exclude` policy; None: `hold`, the default), and the default idle timeout (ms)
    exclude_after: int | None = None
    idle_timeout_ms: int | None = None
    run_id: str | None = None  # the driver run: state file names carry it (fencing)
    merge_state: bool = True  # one state file per task (DESIGN §4 rule 16); False: per unit
    #: one staged data file per task per merging sink (`regional.sinks.base.MergingWriter`)
    #: and epoch; False: one per unit (the layout before merging)
    merge_sink_files: bool = True
    #: run the operators once over the records of a task's units that can share a pass
    #: (`regional.dataflow.walker`); False: one unit at a time
    task_pass: bool = True
    hot_state: bool = True
    hot_state_bytes: int = DEFAULT_HOT_STATE_BYTES
