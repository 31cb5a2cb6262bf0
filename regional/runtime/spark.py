"""Running a pipeline on Spark: the `SparkDispatcher` and `SparkRuntime` (DESIGN §6).

Everything that touches Spark is here; the driver loop itself is `regional.runtime.driver
.JobDriver`. Per epoch the dispatcher runs the units as **one Spark job** in its own job group,
packed into one task per core (research/spark.md §1: the cost is per Python task); units lost
with a failed task are re-run each as their own one-task job (`isolated`). Each task runs
`regional.runtime.task.run_units`, so user exceptions and unit timeouts come back as declines.
A task's work and its answers travel as one msgpack blob each (`msgspec`; pickling a thousand
answers one by one, and unpickling them on the driver, cost about 20 ms of every epoch at
1,024 units); its acks as one `AckBatch`, whose shape the coordinator checks against the
layout in one comparison. Answers reach the driver through `collect()`, or, when the job had to be
cancelled at the epoch deadline (a hang SIGALRM could not break) or failed, through a dict
accumulator that holds every finished task's blob; while a job runs the dispatcher reads that
accumulator every `ANSWER_POLL_S` and reports new answers to `on_answer` (a live progress view).

User code reaches the workers two ways. Modules imported from `code_dir` (the folder of a
pipeline file run by `regional run`) are shipped as files (`SparkContext.addPyFile`), so the
workers import them by name: a msgspec Struct they define keeps its fields, which a Struct
pickled by value does not (msgspec issue #394). Every other module of user code that is not
installed is pickled by value with cloudpickle.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Unpack

import msgspec

from metadata.storage import JobStorage
from regional.coordinator.messages import (
    AckBatch,
    Answer,
    Decline,
    UnitWork,
    answers_of,
    packed,
)
from regional.dataflow.pipeline import Pipeline
from regional.policy import Policy, parse_duration
from regional.runtime.continuous import ContinuousDispatcher
from regional.runtime.dispatch import Dispatch, spread_over_tasks
from regional.runtime.driver import DriverOptions, JobDriver, RunSummary, new_run_id
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.hot_state import DEFAULT_HOT_STATE_BYTES
from regional.runtime.spark_errors import spark_failure
from regional.runtime.task import TaskEnv, run_units

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

__all__ = [
    "CRASH_STEPS",
    "MODES",
    "DriverCrash",
    "Faults",
    "RunSummary",
    "SparkDispatcher",
    "SparkRuntime",
    "attempt_refused",
    "checkpoint_interval_of",
    "task_env",
]

_OURS = frozenset({"regional", "metadata", "cleaner", "builtins", "__main__"})
#: How `SparkRuntime` runs epochs on Spark: one job per epoch, or long-lived tasks.
MODES = ("micro-epoch", "continuous")
#: How often a running Spark job's finished tasks are looked at for live answers.
ANSWER_POLL_S = 0.25


class _DictParam:
    """Accumulator that merges dicts (one entry per task attempt: its answers, encoded)."""

    def zero(self, value: dict[Any, Any]) -> dict[Any, Any]:
        return {}

    def addInPlace(self, a: dict[Any, Any], b: dict[Any, Any]) -> dict[Any, Any]:
        a.update(b)
        return a


def _installed_paths() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({paths["purelib"], paths["platlib"], paths["stdlib"]})


def modules_in(code_dir: str) -> dict[str, str]:
    """The imported user modules that are `.py` files directly in `code_dir` (a pipeline
    file's siblings), by name: their files."""
    folder = os.path.abspath(code_dir)
    found: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if module is None or file is None or "." in name or name in _OURS:
            continue
        path = os.path.abspath(file)
        if path.endswith(".py") and os.path.dirname(path) == folder:
            found[name] = path
    return found


def _ship_modules_as_files(sc: SparkContext, code_dir: str) -> frozenset[str]:
    """Ship the modules imported from `code_dir` to the workers as files (importable by name
    there); returns their names."""
    shipped = modules_in(code_dir)
    for file in shipped.values():
        sc.addPyFile(file)
    return frozenset(shipped)


def _ship_user_code_by_value(pipeline: Pipeline, shipped: frozenset[str] = frozenset()) -> None:
    """Pickle the pipeline's user modules by value: Python workers may not import them (a test
    module, a script loaded from a path); installed packages and the `shipped` modules
    (importable on the workers) are still pickled by name."""
    from pyspark import cloudpickle

    things: list[Any] = []
    for v in pipeline.vertices.values():
        things += [v.source, v.sink, v.operator]
        if v.operator is not None:
            things += v.operator.user_functions()
        if v.source is not None:
            things += list(vars(v.source).values())
    installed = _installed_paths()
    for thing in things:
        name = getattr(thing, "__module__", None) or type(thing).__module__
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if module is None or file is None or name.split(".")[0] in _OURS or name in shipped:
            continue
        if not os.path.abspath(file).startswith(installed):
            with contextlib.suppress(ValueError):
                cloudpickle.register_pickle_by_value(module)


def _warm_up(it: Any) -> Any:
    """Import the task side in a Python worker (the first import costs seconds), then move
    what the import made (modules, classes, functions: hundreds of thousands of objects that
    live as long as the worker) out of the garbage collector's view (`gc.freeze`), so the
    full collections the epochs' allocations trigger do not scan them again and again."""
    import regional.runtime.task  # noqa: F401

    gc.collect()
    gc.freeze()
    return iter([sum(1 for _ in it)])


#: Decode a task's work and answers: one msgpack blob each way per task (~10x cheaper than
#: pickling a thousand Structs one by one).
_WORKS = msgspec.msgpack.Decoder(list[UnitWork])
_ANSWERS = msgspec.msgpack.Decoder(list[Answer | AckBatch])


def _work_blobs(works: list[UnitWork], tasks: int) -> list[bytes]:
    """`works` for `tasks` tasks (`regional.runtime.dispatch.spread_over_tasks`), each task's
    encoded as one blob."""
    return [msgspec.msgpack.encode(s) for s in spread_over_tasks(works, tasks)]


def _work_of(blob: bytes) -> list[UnitWork]:
    """A task's work from its blob (a module function: the task's closure, pickled by value,
    refers to it by name; a Decoder itself does not pickle)."""
    return _WORKS.decode(blob)


def attempt_refused(works: Sequence[UnitWork], attempt: int) -> list[Answer] | None:
    """Spark's attempt policy: a task Spark runs again (`attempt` > 0, after a failed attempt)
    runs none of its units, every one declines, so a region is never re-run behind the
    coordinator's back (DESIGN §4 rule 9); None for a first attempt (its units run)."""
    if attempt <= 0:
        return None
    return [
        Decline(
            w.checkpoint_id,
            w.unit_id,
            w.attempt,
            f"spark task attempt {attempt} refused: units run once per attempt",
        )
        for w in works
    ]


def _epoch_partition(env: TaskEnv, acc: Any) -> Callable[[Any], Any]:
    def run(it: Any) -> Any:
        from pyspark import TaskContext

        # drain the input, or the worker is not reused
        works = [w for blob in it for w in _work_of(blob)]
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        answers = attempt_refused(works, attempt) or run_units(env, works)
        blob = msgspec.msgpack.encode(packed(answers))  # the acks as one AckBatch
        if works:  # one entry per task attempt: a retried task's answers come after
            acc.add({(works[0].checkpoint_id, works[0].unit_id, attempt): blob})
        return iter([blob])

    return run


def _answers(blobs: Iterable[bytes], error: str | None = None) -> Dispatch:
    """The answers in the tasks' blobs, as a `Dispatch`: of two answers of one unit attempt (a
    task Spark ran again) the later one; a task's `AckBatch` stays whole when every ack of it
    is kept (the coordinator checks it in one comparison), else its kept acks go one by one."""
    tasks = [_ANSWERS.decode(blob) for blob in blobs]
    latest: dict[tuple[int, int, int], Answer] = {}
    for items in tasks:
        for a in answers_of(items):
            latest[a.checkpoint_id, a.unit, a.attempt] = a
    kept: set[int] = set(map(id, latest.values()))
    batches: list[AckBatch] = []
    answers: list[Answer] = []
    for items in tasks:
        for item in items:
            if type(item) is AckBatch:
                if all(id(a) in kept for a in item.acks):
                    batches.append(item)
                else:
                    answers += [a for a in item.acks if id(a) in kept]
            elif id(item) in kept:
                answers.append(item)  # type: ignore[arg-type]  # an Ack or a Decline
    return Dispatch(answers, error, batches)


class SparkDispatcher:
    """Runs unit work as Spark jobs on `sc`, `tasks` tasks per epoch, with `env` shipped to
    every task. Implements `regional.coordinator.messages.TaskDispatcher`. `on_answer` is told
    every answer as its task ends, while the job still runs."""

    #: `JobDriver.run` may dispatch from its dispatch thread while it commits the previous
    #: epoch (pipelined commits): a Spark job can be submitted from any thread.
    background_safe = True

    def __init__(
        self,
        sc: SparkContext,
        env: TaskEnv,
        *,
        tasks: int,
        job_id: str,
        on_answer: Callable[[Answer], None] | None = None,
    ) -> None:
        self.sc = sc
        self.env = env
        self.tasks = tasks
        self.job_id = job_id
        self.on_answer = on_answer

    def start(self) -> None:
        """Warm up the Python workers (the first import of the task side costs seconds)."""
        self.sc.parallelize(range(self.tasks), self.tasks).mapPartitions(_warm_up).collect()

    def run(
        self, works: Sequence[UnitWork], deadline_ms: int, *, isolated: bool = False
    ) -> Dispatch:
        if not works:
            return Dispatch([])
        cid = works[0].checkpoint_id
        group = f"regional-{self.job_id}-chk{cid}"
        if not isolated:
            return self._submit(group, f"checkpoint {cid}", list(works), deadline_ms)
        out: list[Answer] = []

        def alone(w: UnitWork) -> None:  # a failed job loses only this unit
            name = f"{group}-u{w.unit_id}-a{w.attempt}"
            got = self._submit(name, f"checkpoint {cid} unit {w.unit_id}", [w], deadline_ms)
            answers = answers_of(got.arrived())
            if not answers and got.error is not None:  # lost again: its own job's reason
                answers = [Decline(w.checkpoint_id, w.unit_id, w.attempt, got.error)]
            out.extend(answers)

        threads = [threading.Thread(target=alone, args=(w,), daemon=True) for w in works]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return Dispatch(out)

    def _submit(
        self, group: str, description: str, works: list[UnitWork], deadline_ms: int
    ) -> Dispatch:
        """One Spark job in job group `group`, cancelled at `deadline_ms`: the answers (from
        collect, or from the accumulator after a cancel or a failure) and why it failed."""
        sc = self.sc
        acc: Any = sc.accumulator({}, _DictParam())  # type: ignore[arg-type]
        fn = _epoch_partition(self.env, acc)
        parts = max(1, min(self.tasks, len(works)))
        box: dict[str, Any] = {}

        def job() -> None:
            sc.setJobGroup(group, description, interruptOnCancel=True)
            try:
                blobs = _work_blobs(works, parts)
                box["answers"] = sc.parallelize(blobs, parts).mapPartitions(fn).collect()
            except Exception as exc:
                box["error"] = exc

        thread = threading.Thread(target=job, name=group, daemon=True)
        thread.start()
        reported: set[Any] = set()
        while thread.is_alive() and (left := deadline_ms / 1000 - time.time()) > 0:
            thread.join(left if self.on_answer is None else min(left, ANSWER_POLL_S))
            self._report_live(acc, reported)
        cancelled = thread.is_alive()
        if cancelled:
            sc.cancelJobGroup(group)
            thread.join()
        if "answers" in box:
            return _answers(box["answers"])
        blobs = dict(acc.value).values()
        if "error" in box and not cancelled:  # name the lost task's units and Spark's reason
            n = len(works)
            units = [[w.unit_id for w in works[i * n // parts : (i + 1) * n // parts]]
                     for i in range(parts)]  # fmt: skip  # as `_work_blobs` slices them
            why = spark_failure(str(box["error"]) or repr(box["error"]), units)
            return _answers(blobs, why)
        return _answers(blobs)

    def _report_live(self, acc: Any, reported: set[Any]) -> None:
        """Tell `on_answer` the answers of tasks that ended since the last look (the
        accumulator is merged on the driver as each task ends)."""
        if self.on_answer is None:
            return
        for key, blob in list(dict(acc.value).items()):  # a copy: tasks merge into it
            if key not in reported:
                reported.add(key)
                for answer in answers_of(_ANSWERS.decode(blob)):
                    self.on_answer(answer)


def checkpoint_interval_of(pipeline: str, mode: str, interval: str | float | None) -> float | None:
    """`SparkRuntime`'s `checkpoint_interval` in seconds (None: not given), checked: only
    continuous mode takes one, and it must be a positive duration.

    >>> checkpoint_interval_of("job", "continuous", "100 ms")
    0.1
    >>> checkpoint_interval_of("job", "micro-epoch", "100 ms")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: SparkRuntime of pipeline 'job': checkpoint_interval='100 ms' needs mode=...
    """
    if interval is None:
        return None
    if mode != "continuous":
        raise ValueError(
            f"SparkRuntime of pipeline {pipeline!r}: checkpoint_interval={interval!r} needs "
            f"mode='continuous' (mode={mode!r} runs one Spark job per epoch, triggered by "
            "`interval`); drop checkpoint_interval or pass mode='continuous'"
        )
    try:
        seconds = parse_duration(interval)
    except ValueError as exc:
        raise ValueError(
            f"SparkRuntime of pipeline {pipeline!r}: checkpoint_interval={interval!r} is not "
            f"a duration ({exc}); give one such as '100 ms' or '1 s'"
        ) from None
    if seconds <= 0:
        raise ValueError(
            f"SparkRuntime of pipeline {pipeline!r}: checkpoint_interval={interval!r} must be "
            "positive, such as '100 ms'"
        )
    return seconds


def event_time_env(policy: Policy) -> dict[str, int | None]:
    """The `TaskEnv` fields of the policy's `[event-time]` table."""
    et = policy.event_time
    idle = et.idle_timeout
    return {
        "exclude_after": et.exclude_after if et.writer_fallback == "exclude" else None,
        "idle_timeout_ms": None if idle is None else max(1, round(idle * 1000)),
    }


def task_env(
    pipeline: Pipeline,
    storage_root: str,
    job_id: str,
    policy: Policy,
    faults: Faults,
    run_id: str,
    *,
    merge_state: bool = True,
    merge_sink_files: bool = True,
    task_pass: bool = True,
    hot_state: bool = True,
    hot_state_bytes: int = DEFAULT_HOT_STATE_BYTES,
) -> TaskEnv:
    """What every task of the job is shipped, from the driver's policy and options."""
    region_timeout = min(policy.checkpointing.timeout, policy.checkpointing.region.timeout)
    event_time = event_time_env(policy)
    return TaskEnv(
        storage_root,
        job_id,
        pipeline,
        # a packed task runs its units one after another: half the deadline per unit leaves
        # the others of a task with a hung unit time to finish before the epoch deadline
        unit_timeout=region_timeout / 2,
        faults=faults.unit_faults(pipeline),
        run_id=run_id,
        merge_state=merge_state,
        merge_sink_files=merge_sink_files,
        task_pass=task_pass,
        hot_state=hot_state,
        hot_state_bytes=hot_state_bytes,
        exclude_after=event_time["exclude_after"],
        idle_timeout_ms=event_time["idle_timeout_ms"],
    )


class SparkRuntime(JobDriver):
    """Runs `pipeline` on `spark` (a SparkSession, or a bare SparkContext: only jobs are
    submitted) with checkpoints under `root` (local path or pyarrow.fs URI): the one
    `JobDriver`, given a `SparkDispatcher`. Every `DriverOptions` key is a keyword
    argument here too (policy, restore, progress, metrics, ...); the rest is Spark's own:

    `job_id` names the job's folder under `root` (default: the pipeline's name). `tasks` is
    how many Spark tasks an epoch packs the units into (default: one per core). `code_dir` (a
    pipeline file's folder) ships the modules imported from it as files (see the module doc).
    `merge_state` (default on) writes one physical state file per Spark task and checkpoint
    (DESIGN §4 rule 16); off, one per unit attempt (the layout before file merging).
    `merge_sink_files` (default on) stages one data file per Spark task, sink and epoch for the
    sinks that merge (`regional.sinks.base.MergingWriter`); off, one per unit. `task_pass`
    (default on) runs a task's units in one pass where they can (`regional.dataflow.
    walker`, DESIGN §6); off, one unit at a time. `hot_state` (default on) keeps the
    operator states a unit acked decoded in its Python worker, so the unit's next epoch in that
    worker (`spark.python.worker.reuse`, Spark's default) restores them without decoding when
    the coordinator names exactly the state they encode (`regional.runtime.hot_state`, DESIGN
    §6); `hot_state_bytes` is each worker's budget, counted at the snapshots' sizes (default
    64 MiB; decoded objects take several times that); off, every epoch decodes its state.

    `mode` is how epochs reach Spark: ``"micro-epoch"`` (the default) submits one Spark job
    per epoch (`SparkDispatcher`); ``"continuous"`` keeps `tasks` long-lived tasks running, each
    its own Spark job, and sends them each epoch's work over a driver channel
    (`regional.runtime.continuous.ContinuousDispatcher`, DESIGN §6): units stay on their task,
    so their state stays hot. Each long-lived task holds a core for the whole run. `run` and
    `savepoint` stop the tasks when they return; after `start` and `epoch`, call `close`.
    `checkpoint_interval` (continuous mode only: a duration such as ``"100 ms"``, or seconds)
    makes every epoch open: its tasks read records as they arrive and run them in small
    batches until the checkpoint's marker, sent that long after the epoch's trigger
    (`regional.runtime.open_epoch`); without it each epoch reads one batch per unit.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        spark: SparkSession | SparkContext,
        *,
        root: str,
        job_id: str | None = None,
        tasks: int | None = None,
        code_dir: str | None = None,
        merge_state: bool = True,
        merge_sink_files: bool = True,
        task_pass: bool = True,
        hot_state: bool = True,
        hot_state_bytes: int = DEFAULT_HOT_STATE_BYTES,
        mode: str = "micro-epoch",
        checkpoint_interval: str | float | None = None,
        **options: Unpack[DriverOptions],
    ) -> None:
        if mode not in MODES:
            raise ValueError(
                f"SparkRuntime mode {mode!r} for pipeline {pipeline.name!r}: use one of "
                f"{', '.join(map(repr, MODES))} (micro-epoch is the default)"
            )
        interval_s = checkpoint_interval_of(pipeline.name, mode, checkpoint_interval)
        from pyspark import SparkContext

        sc = spark if isinstance(spark, SparkContext) else spark.sparkContext
        shipped = _ship_modules_as_files(sc, code_dir) if code_dir else frozenset()
        _ship_user_code_by_value(pipeline, shipped)
        options["run_id"] = run_id = options.get("run_id") or new_run_id()
        storage = JobStorage(root, job_id or pipeline.name)
        env = task_env(
            pipeline,
            root,
            storage.job_id,
            options.get("policy") or Policy(),
            options.get("faults") or Faults(),
            run_id,
            merge_state=merge_state,
            merge_sink_files=merge_sink_files,
            task_pass=task_pass,
            hot_state=hot_state,
            hot_state_bytes=hot_state_bytes,
        )
        watch = options.get("watch")
        self.tasks = tasks or max(1, sc.defaultParallelism)
        on_answer = watch.unit_answered if watch is not None else None
        dispatcher: SparkDispatcher | ContinuousDispatcher
        if mode == "continuous":
            alone = SparkDispatcher(
                sc, env, tasks=self.tasks, job_id=storage.job_id, on_answer=on_answer
            )
            dispatcher = ContinuousDispatcher(
                sc, env, tasks=self.tasks, job_id=storage.job_id, run_id=run_id, isolated=alone,
                checkpoint_interval_s=interval_s,
            )  # fmt: skip
        else:
            dispatcher = SparkDispatcher(
                sc, env, tasks=self.tasks, job_id=storage.job_id, on_answer=on_answer
            )
        super().__init__(pipeline, dispatcher, storage=storage, **options)
        self.mode = mode
        self.checkpoint_interval_s = interval_s
        self.spark = spark
        self.root = root

    def run(
        self, *, max_checkpoints: int | None = None, stop_with_savepoint: bool = False
    ) -> RunSummary:
        """`JobDriver.run`; continuous mode's long-lived tasks stop when it returns."""
        try:
            return super().run(
                max_checkpoints=max_checkpoints, stop_with_savepoint=stop_with_savepoint
            )
        finally:
            self.close()

    def savepoint(self) -> str:
        """`JobDriver.savepoint`; continuous mode's long-lived tasks stop when it returns."""
        try:
            return super().savepoint()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the long-lived tasks of continuous mode (a no-op in micro-epoch mode)."""
        if isinstance(self.dispatcher, ContinuousDispatcher):
            self.dispatcher.close()

    @property
    def env(self) -> TaskEnv:
        """What every task of the job is shipped (benchmarks may replace it between runs)."""
        return self._spark_dispatcher.env

    @env.setter
    def env(self, env: TaskEnv) -> None:
        self._spark_dispatcher.env = env

    @property
    def _spark_dispatcher(self) -> SparkDispatcher | ContinuousDispatcher:
        assert isinstance(self.dispatcher, SparkDispatcher | ContinuousDispatcher)
        return self.dispatcher
