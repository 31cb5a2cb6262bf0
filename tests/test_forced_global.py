"""Why a checkpoint was global is recorded as fields (`forced_global`), and a savepoint is the
coordinator's decision from trigger to metadata: a self-contained copy plus the job's own
global checkpoint of it, which the runtime writes as it is."""

from __future__ import annotations

from test_coordinator_rules import Job, metadata_of

from metadata.model import CheckpointKind, ForcedGlobal
from regional.coordinator import NotifySubsumed, WriteMetadata


def test_an_ordinary_global_checkpoint_records_no_force_and_a_regional_one_neither() -> None:
    job = Job(units=10)
    assert metadata_of(job.run()).forced_global == ()
    regional = metadata_of(job.run(failed={3}))
    assert (regional.kind, regional.forced_global) == (CheckpointKind.REGIONAL, ())


def test_the_job_level_limit_is_recorded_as_the_reason_the_checkpoint_was_global() -> None:
    job = Job(units=10, max_consecutive_regional=2)
    job.run()
    job.run(failed={1})
    job.run(failed={1})
    trigger = job.start()
    assert trigger.forced == (ForcedGlobal.CONSECUTIVE_REGIONAL,)
    out = []
    for u in range(10):
        out += job.ack(u)
    md = metadata_of(out)
    assert (md.kind, md.forced_global) == (CheckpointKind.GLOBAL, trigger.forced)


def test_regional_checkpoints_off_is_recorded_but_is_configuration_not_force() -> None:
    from metadata.inspect import is_forced_global

    md = metadata_of(Job(units=4, enabled=False).run())
    assert md.forced_global == (ForcedGlobal.REGIONAL_DISABLED,)
    assert not is_forced_global(md)


def test_a_savepoint_is_a_self_contained_copy_and_the_jobs_own_global_checkpoint() -> None:
    job = Job(units=4, retained=1)
    job.run()
    out = job.run(durable=False, savepoint=True)
    [write] = [d for d in out if isinstance(d, WriteMetadata)]
    assert write.savepoint is not None
    assert write.savepoint.kind is CheckpointKind.SAVEPOINT
    assert write.metadata.kind is CheckpointKind.GLOBAL
    assert write.metadata.forced_global == (ForcedGlobal.SAVEPOINT,)
    assert write.metadata.reasons[-1] == "savepoint: a self-contained copy is in savepoints/sp-2"
    assert write.savepoint.subtasks == write.metadata.subtasks
    # the job's chk-2 is retained like any checkpoint: it subsumes checkpoint 1
    assert NotifySubsumed(1) in job.finish(out)
