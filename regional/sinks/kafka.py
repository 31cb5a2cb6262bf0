"""An exactly-once Kafka sink for ``read_committed`` consumers (DESIGN §4 rule 8; needs
`regional-checkpoints[kafka]`, i.e. confluent-kafka).

Spark tasks cannot hand an open Kafka transaction to the driver (librdkafka cannot resume a
transaction in another process), so writers *stage* their rows as files, exactly as the Parquet
sink does (`regional.sinks.staging.StagingArea` under ``<staging>/_staging/<job>/``, one file
per task and epoch with a part per unit, `regional.sinks.merging`), and their committables name
them. Once checkpoint Y's metadata is durable, the driver's committer produces the staged rows
of Y's fresh units in **one Kafka transaction** and, in the same transaction, the **marker**:
offset Y committed for partition 0 of the topic in the consumer group `marker_group(user)`
(``send_offsets_to_transaction``). A ``read_committed`` consumer sees all of Y's records or none;
`latest_committed` reads the marker, so a re-commit of an identifier at or below it is skipped
(a driver that crashed after the transaction and before it knew). The transactional id is
fixed per commit user (`transactional_id`), so a restarted driver's ``init_transactions``
fences the old one: a zombie driver can no longer commit.

Every record carries the header ``regional.commit`` = ``<commit user>/<Y>/<n>``, its place in
Y's records (staged files in name order, rows in file order), and before its first record a
commit writes a **start record** (`TransactionStart`, ``<staging>/_transactions/<user>/<Y>.json``:
every partition's end offset). A commit that finds a start record of its identifier (an earlier
try was interrupted) first reads the topic from those offsets with ``read_committed`` and skips
the records of Y already there. Kafka never lets any through (fencing aborts the interrupted
transaction); some Kafka-protocol brokers do (tansu 0.6 makes an abandoned transaction's
records visible when the transactional id is initialised again), and with them too every row is
seen once.

A record's value is the row as a JSON object by default (`msgspec.json`), or one column's
value or a function's result (bytes as they are, text as UTF-8, None a tombstone, anything else
JSON); its key likewise (none by default); its partition a column or function (default: the
producer's partitioner, by key); extra headers a column or function of (key, value) pairs (e.g.
the ``headers`` column `regional.sources.kafka.KafkaSource` reads). The topic must exist.

There is no rollback (records in Kafka cannot be taken back): a restore below the sink's latest
commit is refused (`regional.runtime.restore.roll_back_sinks`). ``read_uncommitted`` consumers
see records of transactions that are later aborted (a failed commit, a fenced driver).

>>> row = {"user": "u1", "count": 3}
>>> encode_field(row, "json"), encode_field("u1", "key"), encode_field(b"\\x00", "key")
(b'{"user":"u1","count":3}', b'u1', b'\\x00')
>>> transactional_id("job-1-4f1c2a-out"), marker_group("job-1-4f1c2a-out")
('regional-job-1-4f1c2a-out', 'regional-commit-job-1-4f1c2a-out')
>>> record_id("job-1-4f1c2a-out", 7, 12)
b'job-1-4f1c2a-out/7/12'
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.format import DECODE_FAILURES
from metadata.layout import name_problem
from metadata.model import SinkRetention
from regional.errors import CommitError, SinkError
from regional.sinks.base import WriteContext
from regional.sinks.durability import fsync_path
from regional.sinks.merging import commit_plan, merged_table, take_ranges
from regional.sinks.staging import StagedFile, StagingArea, file_name, open_location

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer

__all__ = [
    "COMMIT_HEADER",
    "DEFAULT_OFFSETS_RETENTION_MINUTES",
    "KafkaSink",
    "KafkaSinkError",
    "TransactionStart",
    "encode_field",
    "marker_group",
    "record_id",
    "transactional_id",
]

log = logging.getLogger(__name__)

#: The header naming a record's commit user, checkpoint and place in the checkpoint's records.
COMMIT_HEADER = "regional.commit"
#: Where commits keep their start records, in the staging directory.
TRANSACTIONS = "_transactions"
#: Partition of the topic whose offset in `marker_group(user)` is the marker.
MARKER_PARTITION = 0

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_INSTALL = "install regional-checkpoints[kafka], e.g. pip install 'regional-checkpoints[kafka]'"
_START_NAME = re.compile(r"(0|[1-9][0-9]{0,18})\.json")

#: A column name or a function of the row (a dict) giving a record's value, key or partition.
Field = str | Callable[[dict[str, Any]], Any]


#: Kafka's `offsets.retention.minutes` (7 days since Kafka 2.0): what the marker's retention is
#: taken to be when the broker does not report the setting (`KafkaSink.marker_retention`).
DEFAULT_OFFSETS_RETENTION_MINUTES = 7 * 24 * 60


class KafkaSinkError(SinkError):
    """Kafka cannot take a commit right now (unreachable, a broker error): the commit is
    retried at the next epoch. The message names the bootstrap, topic and checkpoint."""


class TransactionStart(msgspec.Struct, frozen=True):
    """Written before a commit's first record: the topic's end offset per partition then, so
    a later try of the same commit knows where an interrupted one's records can be."""

    topic: str
    positions: dict[int, int]


# --- pure parts: names, record encoding ----------------------------------------------------


def transactional_id(commit_user: str) -> str:
    """The Kafka transactional id of a commit user: fixed, so a new driver fences the old."""
    return f"regional-{commit_user}"


def marker_group(commit_user: str) -> str:
    """The consumer group whose offset for the marker partition is the latest committed id."""
    return f"regional-commit-{commit_user}"


def record_id(commit_user: str, identifier: int, seq: int) -> bytes:
    """The `COMMIT_HEADER` value of record `seq` of commit `identifier`."""
    return f"{commit_user}/{identifier}/{seq}".encode()


def encode_field(value: Any, what: str) -> bytes | None:
    """A record's key or value as bytes: bytes as they are, text as UTF-8, None stays None
    (a tombstone), anything else as JSON. `what` names it in errors."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    try:
        return msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError) as exc:
        raise SinkError(f"the record {what} {value!r} does not encode as JSON ({exc})") from None


def _pick(field: Field | None, row: dict[str, Any], what: str) -> Any:
    """`field` of `row`: a column's value or a function's result (None: no field)."""
    if field is None:
        return None
    if callable(field):
        return field(row)
    if field not in row:
        raise SinkError(
            f"the {what} column {field!r} is not among the row's columns {sorted(row)}; name "
            f"a column the sink's rows have, or pass a function of the row"
        )
    return row[field]


def _check_field(name: str, field: Field | None) -> None:
    if field is not None and not callable(field) and not isinstance(field, str):
        raise ValueError(
            f"KafkaSink {name}={field!r}: give a column name or a function of the row (a dict)"
        )


Headers = list[tuple[str, str | bytes | None]]


class _Record(NamedTuple):
    """A row as a Kafka record (`partition` None: the producer's partitioner decides)."""

    key: bytes | None
    value: bytes | None
    partition: int | None
    headers: Headers


def _headers(value: Any) -> Headers:
    """Extra headers from a column or function: (key, value) pairs or {key, value} dicts."""
    pairs: Headers = []
    for h in value or ():
        key, data = (h["key"], h["value"]) if isinstance(h, Mapping) else h
        pairs.append((str(key), encode_field(data, "header value")))
    return pairs


# --- the sink ----------------------------------------------------------------------------------


class KafkaSink:
    """Topic `topic` at `bootstrap`, written exactly-once for ``read_committed`` consumers.

    `staging` is a directory (local path or `pyarrow.fs` URI) that the Spark tasks and the
    driver share, where writers stage rows until the driver commits them. `value`, `key`,
    `partition` and `headers` say how a row (a dict) becomes a record: a column name or a
    function of the row (`value` None: the whole row as JSON; `key` None: no key; `partition`
    None: the producer's partitioner). `timeout` (seconds) bounds each broker request of a
    commit; `config` adds librdkafka settings (security, ...) to every client."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        staging: str,
        value: Field | None = None,
        key: Field | None = None,
        partition: Field | None = None,
        headers: Field | None = None,
        timeout: float = 30.0,
        config: Mapping[str, str] | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        if not _TOPIC.fullmatch(topic):
            raise ValueError(
                f"KafkaSink topic {topic!r} is not a Kafka topic name (1-249 letters, digits, "
                "'.', '_' or '-')"
            )
        for name, field in (("value", value), ("key", key), ("partition", partition)):
            _check_field(name, field)
        _check_field("headers", headers)
        self.bootstrap = bootstrap
        self.topic = topic
        self.staging = staging
        self.value = value
        self.key = key
        self.partition = partition
        self.headers = headers
        self.timeout = timeout
        self.config: dict[str, str | int | float | bool] = dict(config or {})
        self._filesystem = filesystem
        self._init_clients()

    def _init_clients(self) -> None:
        self.area = StagingArea(
            f"Kafka sink {self.topic!r} (staging {self.staging})",
            self._open,
            published=lambda staged: staged,  # never published: produced to Kafka instead
        )
        self._producers: dict[str, Producer] = {}
        self._markers: dict[str, Consumer] = {}
        self._latest: dict[str, int | None] = {}
        self._swept: set[str] = set()  # commit users whose stale start records were deleted

    def __getstate__(self) -> dict[str, Any]:
        """Ship the configuration to tasks, never the driver's Kafka clients."""
        keep = ("bootstrap", "topic", "staging", "value", "key", "partition", "headers")
        state = {k: self.__dict__[k] for k in keep}
        state.update(timeout=self.timeout, config=self.config, _filesystem=self._filesystem)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_clients()

    def __repr__(self) -> str:
        return f"KafkaSink({self.bootstrap!r}, {self.topic!r})"

    def _open(self) -> tuple[pafs.FileSystem, str]:
        if self._filesystem is not None:
            return self._filesystem, self.staging.rstrip("/")
        return open_location(self.staging)

    def _where(self, identifier: int | None = None) -> str:
        at = f"topic {self.topic!r} at Kafka {self.bootstrap}"
        return at if identifier is None else f"{at}, checkpoint {identifier}"

    # --- writer side (in tasks): regional.sinks.base.SinkWriter / MergingWriter ---------------

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Stage `batches` as one file under `_staging/<job_id>/`; its committable (none
        without rows)."""
        table, _ = merged_table([batches])
        if table is None:
            return ()
        return (self.area.stage(context.job_id, _stem(context), table),)

    def write_merged(
        self, parts: Sequence[tuple[WriteContext, Sequence[pa.RecordBatch]]]
    ) -> list[tuple[bytes, ...]]:
        """Stage every part's rows (the units of one task and epoch) as one file; per part,
        its committables (`regional.sinks.base.MergingWriter`)."""
        if not parts:
            return []
        first = parts[0][0]
        return self.area.stage_parts(first.job_id, _stem(first), [b for _, b in parts])

    def sync_staged(self) -> None:
        """Make the staged files durable before the acks naming them leave."""
        self.area.sync()

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete the staged files of a declined or aborted attempt."""
        self.area.discard(committables)

    # --- committer side (on the driver): regional.sinks.base.TableCommitter -------------------

    def latest_committed(self, commit_user: str) -> int | None:
        """The marker: the highest identifier `commit_user` committed (None: nothing). Read
        from Kafka once per commit user, then kept up to date by this sink's commits."""
        if commit_user not in self._latest:
            self._latest[commit_user] = self._read_marker(commit_user)
        return self._latest[commit_user]

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        """The staged files behind `committables` that are gone."""
        return self.area.missing_files(committables)

    def rows_of(self, committables: Iterable[bytes]) -> int:
        """How many rows `committables` hold (for progress displays)."""
        return self.area.rows_of(committables)

    def clean_staged(self, job_id: str, keep: Iterable[bytes]) -> list[str]:
        """Delete job `job_id`'s staged files that no committable in `keep` names
        (`regional.sinks.base.TableStaging`)."""
        return self.area.clean_staged(job_id, keep)

    def marker_retention(self) -> SinkRetention:
        """How long Kafka keeps the marker (`regional.sinks.base.TableRetention`): a consumer
        group's offsets expire `offsets.retention.minutes` after the group's last commit."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, ConfigResource

        admin = AdminClient(self._settings())
        try:
            brokers = admin.list_topics(timeout=self.timeout).brokers
            resource = ConfigResource(ConfigResource.Type.BROKER, str(min(brokers)))
            [future] = admin.describe_configs([resource]).values()
            entry = future.result(timeout=self.timeout).get("offsets.retention.minutes")
        except (KafkaException, ValueError) as exc:
            raise KafkaSinkError(
                f"cannot read offsets.retention.minutes of Kafka {self.bootstrap} ({exc})"
            ) from None
        if entry is None or entry.value is None:
            # The broker answered without the setting: Apache Kafka lists every broker config,
            # defaults included, but a Kafka-protocol broker need not (tansu lists none, and
            # the test broker is one). Not knowing is no error: take Kafka's default, which
            # `inspect validate` judges retained checkpoints against (warning early, never
            # late, for a broker that keeps offsets longer).
            return SinkRetention(
                "",
                "kafka",
                self._where(),
                "offsets.retention.minutes (not reported by the broker: Kafka's default)",
                DEFAULT_OFFSETS_RETENTION_MINUTES * 60_000,
            )
        minutes = int(entry.value)
        return SinkRetention(
            "",
            "kafka",
            self._where(),
            "offsets.retention.minutes",
            None if minutes < 0 else minutes * 60_000,
        )

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Produce the rows behind `committables` and the marker `identifier` in one Kafka
        transaction, then delete the staged files. `fallback` is not recorded (Kafka has no
        place for it)."""
        latest = self.latest_committed(commit_user)
        if latest is not None and identifier <= latest:
            raise CommitError(
                f"Kafka sink, {self._where(identifier)}: commit user {commit_user!r} already "
                f"committed up to {latest}; commits must be in checkpoint order"
            )
        items = sorted(self.area.files(committables), key=lambda i: (i.file, i.first_row))
        if missing := self.area.missing_files(msgspec.msgpack.encode(i) for i in items):
            raise CommitError(
                f"Kafka sink, {self._where(identifier)}: staged file(s) {', '.join(missing[:5])} "
                "are missing (were they deleted?); nothing was committed; restore from a newer "
                "checkpoint or restore the files"
            )
        producer = self._producer(commit_user, identifier)
        partitions = self._partitions(producer, identifier)
        start = self._read_start(commit_user, identifier)
        if start is None:
            start = TransactionStart(self.topic, self._end_offsets(partitions, identifier))
            self._write_start(commit_user, identifier, start)
            present: set[int] = set()
        else:
            present = self._already_there(commit_user, identifier, start, partitions)
        group = self._marker_consumer(commit_user).consumer_group_metadata()
        produced = 0
        try:
            producer.begin_transaction()
            for seq, record in enumerate(self._records(items, identifier)):
                if seq in present:
                    continue
                self._produce(producer, commit_user, identifier, seq, record, partitions)
                produced += 1
            from confluent_kafka import TopicPartition

            marker = [TopicPartition(self.topic, MARKER_PARTITION, identifier)]
            producer.send_offsets_to_transaction(marker, group, self.timeout)
            producer.commit_transaction(self.timeout)
        except Exception as exc:
            self._abandon(commit_user, producer, exc, identifier)
            raise
        self._latest[commit_user] = identifier
        log.info(
            "%s: committed %d records (%d already there)", self._where(identifier), produced,
            len(present),
        )  # fmt: skip
        self._tidy(commit_user, identifier, items)

    # --- rows to records ------------------------------------------------------------------

    def _records(self, items: Sequence[StagedFile], identifier: int) -> Iterator[_Record]:
        """(key, value, partition, headers) of every committed row, in commit order: staged
        files by name, a merged file's kept rows only (`commit_plan`)."""
        fs, base = self.area.location()
        plan = commit_plan(
            items, part=lambda i: i.part, file=lambda i: i.file, describe=lambda i: i.file
        )
        for item, keep in plan:
            table = pq.read_table(self.area.inside(fs, f"{base}/{item.file}"), filesystem=fs)
            if keep is not None:
                table = take_ranges(table, keep)
            elif item.part is not None and item.file_rows != table.num_rows:
                raise CommitError(
                    f"Kafka sink, {self._where(identifier)}: staged file {item.file} holds "
                    f"{table.num_rows} rows, its committables say {item.file_rows}; it was "
                    "changed after staging: restore another checkpoint"
                )
            for row in table.to_pylist():
                try:
                    yield self._record(row)
                except SinkError as exc:
                    raise CommitError(
                        f"Kafka sink, {self._where(identifier)}: a row of {item.file} cannot be "
                        f"a record: {exc}; fix the sink's value/key/partition/headers (nothing "
                        "was committed)"
                    ) from None

    def _record(self, row: dict[str, Any]) -> _Record:
        value = encode_field(
            row if self.value is None else _pick(self.value, row, "value"), "value"
        )
        key = encode_field(_pick(self.key, row, "key"), "key")
        partition = _pick(self.partition, row, "partition")
        if partition is not None and (
            isinstance(partition, bool) or not isinstance(partition, int) or partition < 0
        ):
            raise SinkError(f"the partition {partition!r} is not a partition number")
        return _Record(key, value, partition, _headers(_pick(self.headers, row, "headers")))

    def _produce(
        self,
        producer: Producer,
        user: str,
        identifier: int,
        seq: int,
        record: _Record,
        partitions: int,
    ) -> None:
        key, value, partition, headers = record
        if partition is not None and partition >= partitions:
            raise CommitError(
                f"Kafka sink, {self._where(identifier)}: record {seq} goes to partition "
                f"{partition}, but the topic has partitions 0..{partitions - 1}; fix the "
                "sink's partition= (nothing was committed)"
            )
        kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
        headers = [*headers, (COMMIT_HEADER, record_id(user, identifier, seq))]
        kafka = self._kafka()
        while True:
            try:
                producer.produce(self.topic, value, key, headers=headers, **kwargs)
                return
            except BufferError:  # the local queue is full: let deliveries make room
                producer.poll(0.05)
            except kafka.KafkaException as exc:
                if exc.args[0].code() != kafka.KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                raise CommitError(
                    f"Kafka sink, {self._where(identifier)}: record {seq} is larger than "
                    f"message.max.bytes ({exc.args[0].str()}); make the record smaller, or "
                    "raise message.max.bytes (config=) and the topic's max.message.bytes "
                    "(nothing was committed)"
                ) from None

    # --- Kafka clients ----------------------------------------------------------------------

    def _settings(self) -> dict[str, str | int | float | bool]:
        return {
            "bootstrap.servers": self.bootstrap,
            "socket.timeout.ms": str(max(1, int(self.timeout * 1000))),
            "log_level": "2",
            **self.config,
        }

    def _kafka(self) -> Any:
        try:
            import confluent_kafka
        except ImportError as exc:
            raise SinkError(f"the Kafka sink needs confluent-kafka ({exc}); {_INSTALL}") from None
        return confluent_kafka

    def _unreachable(self, what: str, exc: Exception, identifier: int | None) -> KafkaSinkError:
        return KafkaSinkError(
            f"Kafka sink, {self._where(identifier)}: {what} failed ({exc}); check the "
            "bootstrap address and that the brokers run (the commit is retried at the next "
            "epoch, nothing is committed twice)"
        )

    def _producer(self, user: str, identifier: int) -> Producer:
        """The transactional producer of `user`, initialised once per driver: that fences a
        previous driver's producer of the same id and ends its open transaction."""
        if user in self._producers:
            return self._producers[user]
        kafka = self._kafka()
        producer = kafka.Producer(
            {
                **self._settings(),
                "transactional.id": transactional_id(user),
                "allow.auto.create.topics": "false",
                "linger.ms": "5",
            },
            logger=log,
        )
        try:
            producer.init_transactions(self.timeout)
        except kafka.KafkaException as exc:
            raise self._unreachable("initialising its transactions", exc, identifier) from None
        self._producers[user] = producer
        return producer

    def _abandon(self, user: str, producer: Producer, exc: Exception, identifier: int) -> None:
        """After a failed commit: abort the open transaction when Kafka allows it, else drop
        the producer (the next try initialises a new one, which fences this one). A Kafka
        error becomes a `KafkaSinkError` naming the checkpoint."""
        kafka = self._kafka()
        error = exc.args[0] if isinstance(exc, kafka.KafkaException) and exc.args else None
        aborted = False
        if error is None or not getattr(error, "fatal", lambda: False)():
            with contextlib.suppress(kafka.KafkaException):
                producer.abort_transaction(self.timeout)
                aborted = True
        if not aborted:
            self._producers.pop(user, None)
        if isinstance(exc, kafka.KafkaException):
            raise KafkaSinkError(
                f"Kafka sink, {self._where(identifier)}: the transaction failed ({exc}); "
                f"{'it was aborted' if aborted else 'its producer was fenced or broken'}, the "
                "commit is retried at the next epoch, nothing is committed twice"
            ) from None

    def _marker_consumer(self, user: str) -> Consumer:
        """A consumer of `marker_group(user)` (never subscribed): reads the marker and gives
        the group's metadata to the transaction."""
        if user not in self._markers:
            self._markers[user] = self._kafka().Consumer(
                {
                    **self._settings(),
                    "group.id": marker_group(user),
                    "enable.auto.commit": "false",
                    "isolation.level": "read_committed",
                    "allow.auto.create.topics": "false",
                },
                logger=log,
            )
        return self._markers[user]

    def _read_marker(self, user: str) -> int | None:
        kafka = self._kafka()
        tp = kafka.TopicPartition(self.topic, MARKER_PARTITION)
        try:
            [got] = self._marker_consumer(user).committed([tp], timeout=self.timeout)
        except kafka.KafkaException as exc:
            raise self._unreachable(
                f"reading the marker of commit user {user!r} (group {marker_group(user)!r})",
                exc,
                None,
            ) from None
        return int(got.offset) if got.offset >= 0 else None

    def _partitions(self, producer: Producer, identifier: int) -> int:
        """How many partitions the topic has; `CommitError` when it does not exist."""
        kafka = self._kafka()
        try:
            meta = producer.list_topics(self.topic, timeout=self.timeout)
        except kafka.KafkaException as exc:
            raise self._unreachable("listing the topic", exc, identifier) from None
        found = meta.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            error = None if found is None else found.error
            known = error is not None and error.code() != kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
            why = f" ({error.str()})" if known and error is not None else ""
            raise CommitError(
                f"Kafka sink: topic {self.topic!r} does not exist at Kafka {self.bootstrap}"
                f"{why}, so checkpoint {identifier} cannot be committed: create the topic (the "
                "sink never creates it); nothing was committed"
            )
        return len(found.partitions)

    def _end_offsets(self, partitions: int, identifier: int) -> dict[int, int]:
        """Every partition's end offset now (below any record produced from now on)."""
        kafka = self._kafka()
        from confluent_kafka.admin import AdminClient, OffsetSpec

        admin = AdminClient(self._settings())
        asked = {
            kafka.TopicPartition(self.topic, p): OffsetSpec.latest() for p in range(partitions)
        }
        try:
            answers = admin.list_offsets(asked, request_timeout=self.timeout)
            return {tp.partition: int(f.result().offset) for tp, f in answers.items()}
        except kafka.KafkaException as exc:
            raise self._unreachable("listing the end offsets", exc, identifier) from None

    def _already_there(
        self, user: str, identifier: int, start: TransactionStart, partitions: int
    ) -> set[int]:
        """The places (`record_id`) of commit `identifier`'s records that a ``read_committed``
        consumer already sees, read from the start record's offsets to the end."""
        kafka = self._kafka()
        prefix = f"{user}/{identifier}/".encode()
        consumer = kafka.Consumer(
            {
                **self._settings(),
                "group.id": marker_group(user),
                "enable.auto.commit": "false",
                "isolation.level": "read_committed",
                "enable.partition.eof": "true",
                "allow.auto.create.topics": "false",
            },
            logger=log,
        )
        open_ = {p: start.positions.get(p, kafka.OFFSET_BEGINNING) for p in range(partitions)}
        found: set[int] = set()
        deadline = time.monotonic() + self.timeout
        try:
            consumer.assign([kafka.TopicPartition(self.topic, p, o) for p, o in open_.items()])
            while open_:
                if time.monotonic() > deadline:
                    raise KafkaSinkError(
                        f"Kafka sink, {self._where(identifier)}: reading back what an "
                        f"interrupted try of this commit left did not reach the end of "
                        f"partition(s) {sorted(open_)} within {self.timeout} s (another "
                        "producer's open transaction holds read_committed readers back?); the "
                        "commit is retried at the next epoch"
                    )
                m = consumer.poll(0.5)
                if m is None:
                    continue
                if (err := m.error()) is not None:
                    if err.code() == kafka.KafkaError._PARTITION_EOF:
                        open_.pop(m.partition(), None)
                        continue
                    raise kafka.KafkaException(err)
                for name, data in m.headers() or ():
                    if name == COMMIT_HEADER and data is not None and data.startswith(prefix):
                        found.add(int(data[len(prefix) :]))
        except kafka.KafkaException as exc:
            raise self._unreachable("reading back an interrupted try", exc, identifier) from None
        finally:
            consumer.close()
        if found:
            log.warning(
                "%s: %d records of an interrupted try of this commit are visible already "
                "(the broker did not abort its transaction); they are not produced again",
                self._where(identifier),
                len(found),
            )
        return found

    # --- start records and tidying ---------------------------------------------------------

    def _start_path(self, user: str, identifier: int | None = None) -> str:
        if (problem := name_problem(user)) is not None:
            raise CommitError(
                f"Kafka sink, {self._where(identifier)}: commit user {user!r} cannot name a "
                f"directory ({problem}); nothing was committed"
            )
        fs, base = self.area.location()
        folder = f"{base}/{TRANSACTIONS}/{user}"
        return self.area.inside(fs, folder if identifier is None else f"{folder}/{identifier}.json")

    def _read_start(self, user: str, identifier: int) -> TransactionStart | None:
        fs, _ = self.area.location()
        path = self._start_path(user, identifier)
        try:
            with fs.open_input_stream(path) as f:
                data = f.read()
        except FileNotFoundError:
            return None
        try:
            start = msgspec.json.decode(data, type=TransactionStart)
        except DECODE_FAILURES as exc:
            raise CommitError(
                f"Kafka sink, {self._where(identifier)}: {path} is not a start record ({exc}); "
                "delete it only if no earlier try of this commit can have produced records"
            ) from None
        if start.topic != self.topic:
            raise CommitError(
                f"Kafka sink, {self._where(identifier)}: {path} is the start record of topic "
                f"{start.topic!r}; the job's sink was pointed at another topic mid-commit: "
                f"point it back at {start.topic!r}"
            )
        return start

    def _write_start(self, user: str, identifier: int, start: TransactionStart) -> None:
        """Write the start record durably (before the transaction's first record)."""
        fs, _ = self.area.location()
        path = self._start_path(user, identifier)
        fs.create_dir(posixpath.dirname(path), recursive=True)
        data = msgspec.json.encode(start)
        if not isinstance(fs, pafs.LocalFileSystem):
            with fs.open_output_stream(path) as out:  # one PUT
                out.write(data)
            return
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fsync_path(tmp)
        fs.move(tmp, path)
        fsync_path(posixpath.dirname(path))

    def _tidy(self, user: str, identifier: int, items: Sequence[StagedFile]) -> None:
        """After a commit: delete its staged files and start record, and (once per commit user
        and driver) start records an earlier driver left behind. Best effort: what is left is
        deleted by `clean_staged` at the next start, or waits."""
        fs, base = self.area.location()
        try:
            for file in sorted({i.file for i in items}):
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(self.area.inside(fs, f"{base}/{file}"))
            stale = [identifier]
            if user not in self._swept:
                for info in self.area.listing(self._start_path(user)):
                    name = file_name(info)
                    if _START_NAME.fullmatch(name) and int(name[:-5]) < identifier:
                        stale.append(int(name[:-5]))
                self._swept.add(user)
            for i in stale:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(self._start_path(user, i))
        except OSError as exc:
            log.warning("%s: staged files left after the commit: %s", self._where(identifier), exc)

    def close(self) -> None:
        """Close the driver's Kafka clients (a new commit opens them again)."""
        for consumer in self._markers.values():
            with contextlib.suppress(Exception):
                consumer.close()
        for producer in self._producers.values():
            producer.flush(self.timeout)
        self._markers.clear()
        self._producers.clear()


def _stem(c: WriteContext) -> str:
    """The stem of a staged file of `c`."""
    return re.sub(
        r"[^A-Za-z0-9_.=-]",
        "_",
        f"rows-{c.job_id}-{c.run_id}-c{c.checkpoint_id}-{c.vertex_id}-{c.index}-"
        f"u{c.unit_id}-a{c.attempt}-{uuid.uuid4().hex[:8]}",
    )
