"""Hypothesis stateful test: random event sequences against the real coordinator, with a
model of units, a table sink, metadata storage and driver crashes; invariants after every step
(DESIGN §4 rules 3, 4, 5, 8, 9)."""

from __future__ import annotations

from collections import Counter

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from metadata.model import (
    CheckpointKind,
    CheckpointMetadata,
    SplitState,
    StateHandle,
    SubtaskState,
    VertexInfo,
)
from regional.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    Commit,
    DiscardAttempt,
    FailJob,
    JobLayout,
    NotifyComplete,
    NotifyFallback,
    TriggerCheckpoint,
    WriteMetadata,
)
from regional.coordinator.commit import CommitCoordinator, perform_commit
from regional.errors import CommitError
from regional.policy import CheckpointingPolicy, Policy, RegionPolicy
from regional.sinks.memory import InMemoryTableSink

UNITS = 5
MAX_UNIT_FALLBACKS = 2
LAYOUT = JobLayout(
    units=tuple((("src", u), ("sink", u)) for u in range(UNITS)),
    vertices=(VertexInfo("src", UNITS, 128), VertexInfo("sink", UNITS, 128)),
)
POLICY = Policy(
    checkpointing=CheckpointingPolicy(
        tolerable_failed_checkpoints=1000,
        num_retained=2,
        region=RegionPolicy(  # force-fresh: `units_stay_within_their_fallback_limit`
            max_failure_ratio=0.4,
            max_consecutive_regional=3,
            max_unit_fallbacks=2,
            on_unit_fallback_limit="force-fresh",
        ),
    )
)
units = st.integers(0, UNITS - 1)


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sink = InMemoryTableSink()
        self.storage: dict[int, CheckpointMetadata] = {}  # durable metadata, by id
        self.triggers: dict[int, TriggerCheckpoint] = {}
        self.max_id = 0
        self.now = 0
        self.hung: list[tuple[int, int, tuple[SubtaskState, ...]]] = []
        self._boot(None)

    # --- the model of the runtime ------------------------------------------------------------

    def _boot(self, restore: CheckpointMetadata | None) -> None:
        self.committer = CommitCoordinator("sink", commit_user="job")
        self.c = CheckpointCoordinator(
            LAYOUT, POLICY, job_id="job", coordinators={"sink": self.committer}
        )
        self.trigger: TriggerCheckpoint | None = None
        self.writing: CheckpointMetadata | None = None
        self.commits: list[Commit] = []
        self.failed = False
        self.progress = [0] * UNITS
        self.pending: list[list[bytes]] = [[] for _ in range(UNITS)]
        if restore is not None:
            self._apply(self.c.restore(restore, next_checkpoint_id=self.max_id + 1))
        for u in range(UNITS):
            self._restart(u, crashed=True)

    def _restart(self, u: int, crashed: bool = False) -> None:
        if not crashed:
            self.sink.discard(self.pending[u])
        self.pending[u] = []
        src = self.c.unit_states(u)[0]
        self.progress[u] = int(src.split_states[0].position) if src.split_states else 0

    def _epoch(self, u: int) -> tuple[SubtaskState, ...]:
        assert self.trigger is not None
        cid, attempt = self.trigger.checkpoint_id, self.trigger.attempt
        path = f"chk-{cid}/u{u}-{attempt}.data"
        self.pending[u].append(self.sink.stage(path, [(u, self.progress[u])]))
        self.progress[u] += 1
        handle = StateHandle(f"chk-{cid}/{u}-{attempt}.state", 0, 1, 1, b"h" * 16)
        return (
            SubtaskState(
                "src",
                u,
                u,
                handles=(handle,),
                split_states=(SplitState(f"p{u}", str(self.progress[u]).encode()),),
                attempt=attempt,
            ),
            SubtaskState("sink", u, u, committables=tuple(self.pending[u]), attempt=attempt),
        )

    def _apply(self, decisions: list) -> None:
        for d in decisions:
            event(type(d).__name__)
            if isinstance(d, WriteMetadata):
                event(f"write {d.metadata.kind.value}")
                self._check_metadata(d.metadata)
                self.writing = d.metadata
                self.trigger = None
            elif isinstance(d, Commit):
                self.commits.append(d)
            elif isinstance(d, NotifyComplete):
                for u in d.units:
                    self.pending[u] = []
            elif isinstance(d, NotifyFallback):
                self._restart(d.unit_id)
            elif isinstance(d, AbortCheckpoint):
                self.trigger = None
                self.writing = None
                for u in range(UNITS):
                    self._restart(u)
            elif isinstance(d, DiscardAttempt):
                self.sink.discard(d.all_committables)
            elif isinstance(d, FailJob):
                self.failed = True

    def _answered(self, u: int) -> bool:
        p = self.c._pending
        return (
            p is None
            or p.answered(u)
            or any(h[1] == u for h in self.hung if h[0] == p.checkpoint_id)
        )

    # --- rules --------------------------------------------------------------------------------

    @precondition(lambda self: self.trigger is None and self.writing is None and not self.failed)
    @rule(savepoint=st.booleans())
    def trigger_checkpoint(self, savepoint: bool) -> None:
        self.now += 1000
        self.trigger = self.c.trigger(self.now, savepoint=savepoint and self.now % 3000 == 0)
        self.triggers[self.trigger.checkpoint_id] = self.trigger
        self.max_id = max(self.max_id, self.trigger.checkpoint_id)

    @precondition(lambda self: self.trigger is not None)
    @rule(u=units)
    def ack(self, u: int) -> None:
        if not self._answered(u):
            t = self.trigger
            self._apply(self.c.on_ack(t.checkpoint_id, u, t.attempt, self._epoch(u), self.now + 1))

    @precondition(lambda self: self.trigger is not None)
    @rule(u=units)
    def decline(self, u: int) -> None:
        if not self._answered(u):
            t = self.trigger
            self._apply(self.c.on_decline(t.checkpoint_id, u, t.attempt, "boom", self.now + 1))

    @precondition(lambda self: self.trigger is not None)
    @rule(u=units)
    def hang(self, u: int) -> None:
        if not self._answered(u):
            self.hung.append((self.trigger.checkpoint_id, u, self._epoch(u)))

    @precondition(lambda self: self.trigger is not None)
    @rule(
        answers=st.lists(
            st.sampled_from(["ack"] * 6 + ["decline", "hang"]), min_size=UNITS, max_size=UNITS
        )
    )
    def answer_every_unit(self, answers: list[str]) -> None:
        for u, answer in enumerate(answers):
            if self.trigger is not None:
                getattr(self, answer)(u)
        if self.trigger is not None:
            self.timeout()

    @precondition(lambda self: self.trigger is not None)
    @rule()
    def timeout(self) -> None:
        self._apply(self.c.on_tick(self.trigger.deadline_ms))

    @precondition(lambda self: any(h[0] != self.c.pending_checkpoint_id for h in self.hung))
    @rule()
    def late_ack(self) -> None:
        late = [h for h in self.hung if h[0] != self.c.pending_checkpoint_id]
        self.hung.remove(late[0])
        cid, u, states = late[0]
        out = self.c.on_ack(cid, u, 1, states, self.now + 2)
        assert [type(d) for d in out] == [DiscardAttempt]
        self._apply(out)

    @precondition(lambda self: self.writing is not None)
    @rule()
    def metadata_durable(self) -> None:
        md = self.writing
        self.storage[md.checkpoint_id] = md
        self.writing = None
        self._apply(self.c.on_metadata_durable(md.checkpoint_id, self.now + 3))

    @precondition(lambda self: self.writing is not None)
    @rule()
    def metadata_write_fails(self) -> None:
        md = self.writing
        self._apply(self.c.on_metadata_failed(md.checkpoint_id, "disk full", self.now + 3))

    @precondition(lambda self: bool(self.commits))
    @rule(fail=st.booleans())
    def run_commit(self, fail: bool) -> None:
        commit = self.commits.pop(0)
        self.sink.fail_next_commits = int(fail)
        try:
            perform_commit(commit, self.sink)
        except CommitError:
            self._apply(self.c.on_commit_failed("sink", commit.checkpoint_id, "injected"))
        else:
            self._apply(self.c.on_commit_done("sink", commit.checkpoint_id))
        self.sink.fail_next_commits = 0

    @rule(written=st.booleans())
    def driver_crash_and_restore(self, written: bool) -> None:
        if written and self.writing is not None:  # crash after the write, before it was seen
            self.storage[self.writing.checkpoint_id] = self.writing
        self.hung = []
        latest = self.storage[max(self.storage)] if self.storage else None
        self._boot(latest)

    # --- invariants ---------------------------------------------------------------------------

    def _check_metadata(self, md: CheckpointMetadata) -> None:
        cid = md.checkpoint_id
        keys = [(s.vertex_id, s.index) for s in md.subtasks]
        assert sorted(keys) == sorted(k for unit in LAYOUT.units for k in unit)  # one each
        by_unit: dict[int, set[int | None]] = {}
        for s in md.subtasks:
            by_unit.setdefault(s.unit_id, set()).add(s.ref_checkpoint_id)
            if s.ref_checkpoint_id is None:
                continue
            ref = s.ref_checkpoint_id
            if ref == 0:
                assert s.handles == () and s.committables == ()
                continue
            assert ref < cid and ref in self.storage, (cid, ref)
            [owner] = [
                o
                for o in self.storage[ref].subtasks
                if (o.vertex_id, o.index) == (s.vertex_id, s.index)
            ]
            assert owner.ref_checkpoint_id is None and owner.handles == s.handles
        assert all(len(refs) == 1 for refs in by_unit.values())  # never half fresh
        trigger = self.triggers[cid]
        fallback = {u.unit_id for u in md.fallback_units}
        if trigger.kind is not CheckpointKind.REGIONAL:
            assert not fallback
        assert not fallback & trigger.must_be_fresh

    @invariant()
    def units_stay_within_their_fallback_limit(self) -> None:
        streak = Counter[int]()
        for cid in sorted(self.storage):
            fallback = {u.unit_id for u in self.storage[cid].fallback_units}
            streak = Counter({u: streak[u] + 1 for u in fallback})
            assert all(n <= MAX_UNIT_FALLBACKS for n in streak.values())

    @invariant()
    def commits_are_ordered_without_gaps_or_duplicates(self) -> None:
        ids = [i for _, i, _ in self.sink.log]
        assert ids == sorted(set(ids))
        assert set(ids) <= set(self.storage)
        rows = self.sink.rows()
        assert len(rows) == len(set(rows))  # no duplicate
        for u in range(UNITS):
            mine = sorted(k for unit, k in rows if unit == u)
            assert mine == list(range(len(mine)))  # no hole: a prefix of the unit's input


CoordinatorMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestCoordinatorStateful = CoordinatorMachine.TestCase
