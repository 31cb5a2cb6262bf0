"""The driver channel of continuous mode (DESIGN §6): how long-lived Spark tasks and the
driver talk over TCP while one Spark job runs.

Spark has no path from a running Python task to the driver that fits per-epoch messages
(research/continuous.md §3: barrier calls are stage-wide, accumulators arrive at task end), so
the driver runs its own TCP server on `spark.driver.host` and every task of the long job
connects to it. This module is the protocol, as pure code, and a thin socket adapter:

* **framing**: every message is a msgspec Struct (`Message`), msgpack-encoded, behind a 4-byte
  big-endian length; `FrameReader` takes bytes as they come and gives whole messages back, and
  refuses a frame longer than `MAX_FRAME` (a stray client, a corrupt stream);
* **handshake**: the driver sends a `Challenge` (a fresh nonce); the task answers `Hello` (run
  id, task index, Spark attempt number, task attempt id, a nonce of its own) with an HMAC
  over both nonces and its fields, keyed by the run's token (`secrets.token_bytes(32)`, shipped
  in the task closure, never sent); the driver checks it (`admit`) and proves it holds the
  token too (`Welcome`), so neither side talks to an impostor;
* **fencing**: `Fencing` keeps one live attempt per task index, ordered by Spark's task attempt
  id (unique and increasing within a SparkContext): a newer `Hello` for an index replaces the
  older connection (which is closed), an older one is refused. `EpochRound` accepts a task's
  `Answers` only when run, checkpoint, task attempt and units are exactly what it was sent, so
  the answers of a dead or older attempt, or of an earlier epoch, never reach the coordinator;
* **sockets**: `ChannelServer` (the driver's side: accept, handshake, one reader thread per
  connection, an inbox) and `TaskChannel` (a task's side: connect, handshake, send, receive).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import logging
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Sequence

import msgspec

from regional.coordinator.messages import AckBatch, Answer, UnitWork, answers_of
from regional.coordinator.verdict import name_units

__all__ = [
    "MAX_FRAME",
    "Admission",
    "Answers",
    "Challenge",
    "ChannelClosed",
    "ChannelError",
    "ChannelServer",
    "EpochRound",
    "Fencing",
    "FrameReader",
    "Hello",
    "Marker",
    "Message",
    "Stop",
    "TaskAttempt",
    "TaskChannel",
    "Welcome",
    "Work",
    "admit",
    "frame",
    "hello_mac",
    "new_token",
    "welcome_mac",
]

log = logging.getLogger(__name__)

#: The largest frame either side accepts (a task's answers for a thousand units are ~1 MiB).
MAX_FRAME = 256 * 2**20
_LENGTH = struct.Struct(">I")
_NONCE_BYTES = 32
#: How long a new connection may take to complete its handshake.
HANDSHAKE_TIMEOUT_S = 30.0


class ChannelError(Exception):
    """The channel's bytes or handshake are not what the protocol allows."""


class ChannelClosed(ChannelError):
    """The other side closed the connection."""


# --- messages -------------------------------------------------------------------------------


class Challenge(msgspec.Struct, frozen=True, tag="challenge", array_like=True):
    """Driver → task, first: the nonce the task's `Hello` must be keyed over."""

    nonce: bytes


class Hello(msgspec.Struct, frozen=True, tag="hello", array_like=True):
    """Task → driver, once: who the task is (run, task index in the long job, Spark's attempt
    number and task attempt id), its own nonce, and `mac` (`hello_mac`)."""

    run_id: str
    task: int
    spark_attempt: int
    task_attempt_id: int
    nonce: bytes
    mac: bytes


class Welcome(msgspec.Struct, frozen=True, tag="welcome", array_like=True):
    """Driver → task: the task is admitted; `mac` (`welcome_mac`) proves the driver holds the
    run's token."""

    mac: bytes


class Work(msgspec.Struct, frozen=True, tag="work", array_like=True):
    """Driver → task: run `works` (units `units`) for checkpoint `checkpoint_id`, as attempt
    `task_attempt_id` of the task. With `open_epoch` (a `checkpoint_interval`) the units read
    records as they arrive until the checkpoint's `Marker`, then snapshot and answer;
    without, they read one batch each and answer at once."""

    run_id: str
    checkpoint_id: int
    task_attempt_id: int
    units: tuple[int, ...]
    works: list[UnitWork]
    open_epoch: bool = False


class Marker(msgspec.Struct, frozen=True, tag="marker", array_like=True):
    """Driver → task: checkpoint `checkpoint_id`'s marker; the open epoch of that checkpoint
    closes (its units finish the batch they run, snapshot and answer)."""

    run_id: str
    checkpoint_id: int


class Answers(msgspec.Struct, frozen=True, tag="answers", array_like=True):
    """Task → driver: the answers of the `Work` with the same tags (acks packed per task)."""

    run_id: str
    checkpoint_id: int
    task_attempt_id: int
    units: tuple[int, ...]
    answers: list[Answer | AckBatch]


class Stop(msgspec.Struct, frozen=True, tag="stop", array_like=True):
    """Driver → task: return from the task (the dispatcher is closing)."""

    run_id: str
    reason: str = ""


Message = Challenge | Hello | Welcome | Work | Marker | Answers | Stop

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Message)


# --- framing --------------------------------------------------------------------------------


def frame(message: Message) -> bytes:
    """`message` as one frame: its msgpack length (4 bytes, big-endian), then the msgpack.

    >>> data = frame(Stop("r"))
    >>> int.from_bytes(data[:4], "big") == len(data) - 4
    True
    """
    body = _ENCODER.encode(message)
    if len(body) > MAX_FRAME:
        raise ChannelError(f"a {type(message).__name__} of {len(body)} bytes is over the "
                           f"{MAX_FRAME}-byte frame limit; run fewer units per task")  # fmt: skip
    return _LENGTH.pack(len(body)) + body


class FrameReader:
    """Turns a byte stream into messages, whatever the chunks it arrives in.

    >>> r = FrameReader()
    >>> data = frame(Stop("r", "done"))
    >>> r.feed(data[:3]), r.feed(data[3:])
    ([], [Stop(run_id='r', reason='done')])
    """

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._limit = limit

    def feed(self, data: bytes) -> list[Message]:
        """The messages `data` completes, in order. Raises `ChannelError` for a frame over
        the limit or one that is not a protocol message."""
        self._buffer += data
        out: list[Message] = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > self._limit:
                raise ChannelError(
                    f"frame of {length} bytes is over the {self._limit}-byte limit: not a "
                    "regional task (check what connects to the driver's channel port)"
                )
            end = _LENGTH.size + length
            if len(self._buffer) < end:
                break
            body = bytes(self._buffer[_LENGTH.size : end])
            del self._buffer[:end]
            try:
                out.append(_DECODER.decode(body))
            except msgspec.DecodeError as exc:
                raise ChannelError(f"not a channel message: {exc}") from None
        return out

    @property
    def pending(self) -> int:
        """Bytes held toward a frame not complete yet."""
        return len(self._buffer)


# --- handshake ------------------------------------------------------------------------------


def new_token() -> bytes:
    """A run's channel token: 32 random bytes, shipped to the tasks in their closure."""
    return secrets.token_bytes(32)


def hello_mac(
    token: bytes, challenge: bytes, run_id: str, task: int, spark_attempt: int,
    task_attempt_id: int, nonce: bytes,
) -> bytes:  # fmt: skip
    """The HMAC-SHA256 a task's `Hello` carries: over the driver's nonce and every field."""
    signed = _ENCODER.encode(
        ("regional-hello-1", challenge, run_id, task, spark_attempt, task_attempt_id, nonce)
    )
    return hmac.new(token, signed, hashlib.sha256).digest()


def welcome_mac(token: bytes, challenge: bytes, task_nonce: bytes) -> bytes:
    """The HMAC-SHA256 the driver's `Welcome` carries: over the task's nonce and its own."""
    signed = _ENCODER.encode(("regional-welcome-1", challenge, task_nonce))
    return hmac.new(token, signed, hashlib.sha256).digest()


def admit(token: bytes, challenge: bytes, run_id: str, tasks: int, hello: Hello) -> str | None:
    """Why the driver refuses `hello` (answering `challenge`), or None to admit it: the MAC
    must be the token's (compared in constant time), the run this driver's, the task index one
    of the long job's `tasks`."""
    expected = hello_mac(
        token, challenge, hello.run_id, hello.task, hello.spark_attempt, hello.task_attempt_id,
        hello.nonce,
    )  # fmt: skip
    if not hmac.compare_digest(expected, hello.mac):
        return "bad HMAC: the task does not hold this run's channel token"
    if hello.run_id != run_id:
        return f"run {hello.run_id!r} is not this driver's run {run_id!r}"
    if not 0 <= hello.task < tasks:
        return f"task index {hello.task} is not one of the job's {tasks} tasks"
    return None


# --- fencing --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskAttempt:
    """One admitted attempt of a task of the long job, on connection `connection`."""

    task: int
    spark_attempt: int
    task_attempt_id: int
    connection: int

    def name(self) -> str:
        return (
            f"task {self.task} (Spark attempt {self.spark_attempt}, "
            f"task attempt id {self.task_attempt_id})"
        )


@dataclasses.dataclass(frozen=True)
class Admission:
    """What `Fencing.hello` decided: `refused` (why) or admitted; `fenced`, the connection of
    the older attempt this one replaces (to close)."""

    refused: str | None = None
    fenced: TaskAttempt | None = None


class Fencing:
    """The live attempt of every task index (pure: connections are ids).

    >>> f = Fencing()
    >>> f.hello(TaskAttempt(0, 0, 7, connection=1))
    Admission(refused=None, fenced=None)
    >>> f.hello(TaskAttempt(0, 1, 9, connection=2)).fenced.connection
    1
    >>> f.hello(TaskAttempt(0, 0, 7, connection=3)).refused
    'task 0: task attempt id 7 is not newer than the live attempt 9'
    """

    def __init__(self) -> None:
        self.live: dict[int, TaskAttempt] = {}
        self._newest: dict[int, int] = {}  # task index: the newest task attempt id admitted

    def hello(self, attempt: TaskAttempt) -> Admission:
        """Admit `attempt` unless an attempt with the same or a newer task attempt id was
        admitted for its task index before; the live attempt it replaces is fenced."""
        newest = self._newest.get(attempt.task)
        if newest is not None and attempt.task_attempt_id <= newest:
            return Admission(
                refused=f"task {attempt.task}: task attempt id {attempt.task_attempt_id} is "
                f"not newer than the live attempt {newest}"
            )
        self._newest[attempt.task] = attempt.task_attempt_id
        old = self.live.get(attempt.task)
        self.live[attempt.task] = attempt
        return Admission(fenced=old)

    def gone(self, connection: int) -> TaskAttempt | None:
        """Connection `connection` dropped: the attempt on it, if it was live (else None)."""
        for task, attempt in self.live.items():
            if attempt.connection == connection:
                del self.live[task]
                return attempt
        return None

    def current(self, connection: int) -> TaskAttempt | None:
        """The live attempt on `connection`, or None (fenced, refused or gone)."""
        for attempt in self.live.values():
            if attempt.connection == connection:
                return attempt
        return None


class EpochRound:
    """One epoch's round trip over the channel (pure): what each task attempt was sent, what
    came back. Answers count only from the attempt the work went to, for this run and
    checkpoint and exactly its units; a task whose connection drops is lost with its units.

    >>> w = [UnitWork(4, 1, u, ()) for u in (0, 1)]
    >>> r = EpochRound("run", 4)
    >>> t = TaskAttempt(0, 0, 7, connection=1)
    >>> r.sent(t, w)
    Work(run_id='run', checkpoint_id=4, task_attempt_id=7, units=(0, 1), works=[...], ...)
    >>> r.take(Answers("run", 3, 7, (0, 1), []))  # an earlier epoch's
    'task attempt 7: answers of checkpoint 3, not 4'
    >>> r.lost_task(t), r.done, r.lost_units
    (True, True, [0, 1])
    """

    def __init__(self, run_id: str, checkpoint_id: int) -> None:
        self.run_id = run_id
        self.checkpoint_id = checkpoint_id
        self.out: dict[int, tuple[TaskAttempt, tuple[int, ...]]] = {}  # task: attempt, units
        self.answered: dict[int, list[Answer | AckBatch]] = {}
        self.lost: dict[int, str] = {}  # task: why
        self._lost_units: dict[int, tuple[int, ...]] = {}

    def sent(
        self, attempt: TaskAttempt, works: Sequence[UnitWork], *, open_epoch: bool = False
    ) -> Work:
        """Record that `works` go to `attempt`; the message to send it (an open epoch's with
        `open_epoch`: it runs until the checkpoint's `Marker`)."""
        units = tuple(w.unit_id for w in works)
        self.out[attempt.task] = (attempt, units)
        return Work(self.run_id, self.checkpoint_id, attempt.task_attempt_id, units, list(works),
                    open_epoch)  # fmt: skip

    def unsent(self, task: int, units: Sequence[int], why: str) -> None:
        """`units` of task `task` could not be sent (no live attempt, a failed send)."""
        self.out.pop(task, None)
        self.lost[task] = f"{why} ({name_units(units)})"
        self._lost_units[task] = tuple(units)

    def take(self, answers: Answers, sender: TaskAttempt | None = None) -> str | None:
        """Keep `answers` (that came from `sender`, when known) if they are this round's from
        the attempt their work went to; else why they are fenced."""
        who = f"task attempt {answers.task_attempt_id}"
        if sender is not None and sender.task_attempt_id != answers.task_attempt_id:
            return f"{sender.name()} sent answers tagged {who}"
        if answers.run_id != self.run_id:
            return f"{who}: answers of run {answers.run_id!r}, not {self.run_id!r}"
        if answers.checkpoint_id != self.checkpoint_id:
            return f"{who}: answers of checkpoint {answers.checkpoint_id}, not {self.checkpoint_id}"
        for task, (attempt, units) in self.out.items():
            if attempt.task_attempt_id != answers.task_attempt_id:
                continue
            if task in self.answered or task in self.lost:
                return f"{who}: task {task} already answered or was lost"
            given = {a.unit for a in answers_of(answers.answers)}
            if answers.units != units or not given <= set(units):
                return f"{who}: answers for units other than those sent ({name_units(units)})"
            self.answered[task] = answers.answers
            return None
        return f"{who}: no work of checkpoint {self.checkpoint_id} went to it"

    def lost_task(self, attempt: TaskAttempt, why: str = "connection dropped") -> bool:
        """`attempt`'s connection dropped (or a send to it failed): True when it had this
        round's work and had not answered; its units are lost."""
        task = attempt.task
        sent = self.out.get(task)
        if sent is None or sent[0] != attempt or task in self.answered or task in self.lost:
            return False
        self.lost[task] = f"{attempt.name()} lost: {why} ({name_units(sent[1])})"
        self._lost_units[task] = sent[1]
        return True

    @property
    def done(self) -> bool:
        """Every task sent work answered or was lost."""
        return all(t in self.answered or t in self.lost for t in self.out)

    @property
    def waiting(self) -> list[int]:
        """The tasks whose answers are still due."""
        return [t for t in self.out if t not in self.answered and t not in self.lost]

    @property
    def lost_units(self) -> list[int]:
        """The units of lost (or unsent) tasks, sorted."""
        return sorted(u for units in self._lost_units.values() for u in units)

    def arrived(self) -> list[Answer | AckBatch]:
        """Every answer kept, task by task."""
        return [item for items in self.answered.values() for item in items]


# --- sockets --------------------------------------------------------------------------------


def _send(sock: socket.socket, message: Message) -> None:
    sock.sendall(frame(message))


def _receive(sock: socket.socket, reader: FrameReader, queue: list[Message]) -> Message:
    """The next message on `sock` (`queue`: messages already read); `ChannelClosed` at EOF."""
    while not queue:
        data = sock.recv(1 << 16)
        if not data:
            raise ChannelClosed("the other side closed the connection")
        queue += reader.feed(data)
    return queue.pop(0)


class TaskChannel:
    """A task's connection to the driver's channel (made by `connect`)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._reader = FrameReader()
        self._queue: list[Message] = []

    @classmethod
    def connect(
        cls, address: tuple[str, int], token: bytes, run_id: str, task: int,
        spark_attempt: int, task_attempt_id: int, timeout: float = HANDSHAKE_TIMEOUT_S,
    ) -> TaskChannel:  # fmt: skip
        """Connect to the driver at `address` and pass the handshake; `ChannelError` if the
        driver is not the run's (its `Welcome` does not prove the token)."""
        sock = socket.create_connection(address, timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            channel = cls(sock)
            challenge = channel.receive()
            if not isinstance(challenge, Challenge):
                raise ChannelError(f"expected a challenge, got {type(challenge).__name__}")
            nonce = secrets.token_bytes(_NONCE_BYTES)
            mac = hello_mac(token, challenge.nonce, run_id, task, spark_attempt,
                            task_attempt_id, nonce)  # fmt: skip
            channel.send(Hello(run_id, task, spark_attempt, task_attempt_id, nonce, mac))
            welcome = channel.receive()
            if not isinstance(welcome, Welcome) or not hmac.compare_digest(
                welcome.mac, welcome_mac(token, challenge.nonce, nonce)
            ):
                raise ChannelError(
                    f"the server at {address[0]}:{address[1]} did not prove run {run_id}'s token"
                )
            sock.settimeout(None)  # work arrives when the driver triggers an epoch
            return channel
        except BaseException:
            sock.close()
            raise

    def send(self, message: Message) -> None:
        _send(self.sock, message)

    def receive(self) -> Message:
        """The next message; `ChannelClosed` once the driver is gone."""
        return _receive(self.sock, self._reader, self._queue)

    def poll(self, timeout: float = 0.0) -> Message | None:
        """The next message if one arrives within `timeout` seconds (0: only what is there
        already), else None; `ChannelClosed` once the driver is gone."""
        until = time.monotonic() + timeout
        while not self._queue:
            left = max(0.0, until - time.monotonic())
            readable, _, _ = select.select([self.sock], [], [], left)
            if not readable:
                return None
            data = self.sock.recv(1 << 16)
            if not data:
                raise ChannelClosed("the other side closed the connection")
            self._queue += self._reader.feed(data)
        return self._queue.pop(0)

    def close(self) -> None:
        self.sock.close()


class ChannelServer:
    """The driver's side: a TCP server on `host` that admits the tasks of run `run_id` (a job
    of `tasks` tasks) holding `token`. Admitted attempts are in `fencing.live`; every message
    they send after the handshake goes to `inbox` as (attempt, message); `changed` is notified
    on every admission, message and dropped connection (`dropped` lists the attempts)."""

    def __init__(self, host: str, token: bytes, run_id: str, tasks: int) -> None:
        self.token, self.run_id, self.tasks = token, run_id, tasks
        self.changed = threading.Condition()
        self.fencing = Fencing()
        self.inbox: list[tuple[TaskAttempt, Message]] = []
        self.dropped: list[TaskAttempt] = []
        self.refused: list[str] = []
        self._socks: dict[int, socket.socket] = {}
        self._next = 0
        self._closed = False
        self._listener = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        threading.Thread(target=self._accept, name="channel-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self.changed:
                self._next += 1
                connection = self._next
            threading.Thread(
                target=self._serve, args=(sock, connection), name=f"channel-{connection}",
                daemon=True,
            ).start()  # fmt: skip

    def _serve(self, sock: socket.socket, connection: int) -> None:
        attempt: TaskAttempt | None = None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            reader, queue = FrameReader(), []  # type: ignore[var-annotated]
            challenge = secrets.token_bytes(_NONCE_BYTES)
            _send(sock, Challenge(challenge))
            hello = _receive(sock, reader, queue)
            if not isinstance(hello, Hello):
                raise ChannelError(f"expected a hello, got {type(hello).__name__}")
            why = admit(self.token, challenge, self.run_id, self.tasks, hello)
            candidate = TaskAttempt(hello.task, hello.spark_attempt, hello.task_attempt_id,
                                    connection)  # fmt: skip
            with self.changed:
                if why is None and not self._closed:
                    admission = self.fencing.hello(candidate)
                    why = admission.refused
                if why is not None:
                    self.refused.append(why)
                    log.warning("channel of run %s refused a connection: %s", self.run_id, why)
                    return
                attempt = candidate
                self._socks[connection] = sock
                _send(sock, Welcome(welcome_mac(self.token, challenge, hello.nonce)))
                sock.settimeout(None)
                if admission.fenced is not None:  # the older attempt's connection is cut
                    self._cut(admission.fenced)
                self.changed.notify_all()
            while True:
                message = _receive(sock, reader, queue)
                with self.changed:
                    if self.fencing.current(connection) is None:
                        return  # fenced meanwhile: nothing it says counts
                    self.inbox.append((attempt, message))
                    self.changed.notify_all()
        except (OSError, ChannelError) as exc:
            if attempt is None:
                log.warning("channel of run %s: a connection failed its handshake: %s",
                            self.run_id, exc)  # fmt: skip
        finally:
            with self.changed:
                self._socks.pop(connection, None)
                gone = self.fencing.gone(connection)
                if gone is not None:
                    self.dropped.append(gone)
                self.changed.notify_all()
            sock.close()

    def _cut(self, attempt: TaskAttempt) -> None:
        """Cut `attempt`'s connection (fenced): it no longer counts, and a round that waits
        on it learns it is gone (`dropped`). Call under `changed`."""
        self.fencing.gone(attempt.connection)
        self.dropped.append(attempt)
        sock = self._socks.pop(attempt.connection, None)
        if sock is not None:
            with contextlib.suppress(OSError):  # closed by the other side already
                sock.shutdown(socket.SHUT_RDWR)

    def fence(self, task: int) -> TaskAttempt | None:
        """Fence task `task`'s live attempt (its job was cancelled): cut its connection now,
        so nothing more is sent to it or taken from it; the attempt, or None."""
        with self.changed:
            attempt = self.fencing.live.get(task)
            if attempt is not None:
                self._cut(attempt)
                self.changed.notify_all()
            return attempt

    def send(self, attempt: TaskAttempt, message: Message) -> str | None:
        """Send `message` to `attempt`; why it could not be sent (no longer live), or None."""
        with self.changed:
            sock = self._socks.get(attempt.connection)
            if sock is None or self.fencing.current(attempt.connection) != attempt:
                return f"{attempt.name()} is no longer connected"
        try:
            _send(sock, message)
        except OSError as exc:
            return f"sending to {attempt.name()} failed: {exc}"
        return None

    def close(self) -> None:
        """Stop accepting and cut every connection (tasks see the driver go and return)."""
        with self.changed:
            self._closed = True
            for attempt in list(self.fencing.live.values()):
                self._cut(attempt)
            self.changed.notify_all()
        with contextlib.suppress(OSError):  # wakes the accept thread (a close alone does not)
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
