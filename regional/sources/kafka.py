"""A Kafka source (needs `regional-checkpoints[kafka]`, i.e. confluent-kafka): a split per topic
partition.

The split id is ``<topic>:<partition>`` (a topic name never holds ``:``); the position kept in
the reading subtask's state is the next offset to read, as text (``b"42"``; ``b""`` = the start
given by `start`). In bounded mode the stop offset is kept with it (``b"42/100"``): the partition's
end offset seen by the split's first read, so a fallback unit re-reads exactly the same records.
Reads use explicit partition assignment and seeks: Kafka's consumer-group offsets are never the
source of truth (`commit_group` only copies checkpointed offsets there for lag tools). Each
read assigns its one partition afresh at the read's start offset and unassigns it at the end, so
nothing fetched for one read is handed out by another; the consumer itself is kept per process.

Partitions are discovered on the driver every epoch (`discover`), so partitions and, with
`pattern`, topics created while the job runs become new splits. A read returns as soon as it
has `max_records` records or the partition has no more (an empty poll or the end of the
partition): the unit's epoch never waits for its deadline.

>>> split_id("clicks", 3)
'clicks:3'
>>> parse_split_id("clicks:3", "the Kafka source at localhost:9092")
('clicks', 3)
>>> decode_position(encode_position(42, 100), "clicks:3")
(42, 100)
>>> decode_position(b"", "clicks:3")
(None, None)
>>> decode_value(b'{"user": "u1"}', "json", "clicks", 3, 7)
{'user': 'u1'}
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from metadata.errors import MetadataError, RegionalError
from regional.sources import json_text
from regional.sources.base import Batch, PoisonRecord, ReadResult

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

__all__ = [
    "HEADERS_TYPE",
    "KafkaSource",
    "KafkaSourceError",
    "decode_position",
    "decode_value",
    "encode_position",
    "out_of_range",
    "parse_split_id",
    "split_id",
    "unread_since",
]

log = logging.getLogger(__name__)

Decoder = Literal["bytes", "utf-8", "json"] | Callable[[bytes], Any]

#: The Arrow type of the `headers` column: a list of (key, value) pairs, in record order.
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

_SPLIT = re.compile(r"([A-Za-z0-9._-]{1,249}):(0|[1-9][0-9]{0,9})")
_POSITION = re.compile(rb"(0|[1-9][0-9]{0,18})(?:/(0|[1-9][0-9]{0,18}))?")
_INSTALL = "install regional-checkpoints[kafka], e.g. pip install 'regional-checkpoints[kafka]'"


class KafkaSourceError(RegionalError):
    """Kafka cannot be read as configured or right now; the message names the broker, topic,
    partition and offset, and what to do. In a task it declines the unit (regional fallback)."""


# --- pure parts: split ids, positions, values ---------------------------------------------------


def split_id(topic: str, partition: int) -> str:
    """The split id of a topic partition."""
    return f"{topic}:{partition}"


def parse_split_id(split: str, source: str) -> tuple[str, int]:
    """(topic, partition) of a split id; `MetadataError` for anything else (split ids come back
    from checkpoints, so a malformed one was tampered with)."""
    match = _SPLIT.fullmatch(split)
    if match is None:
        raise MetadataError(
            f"split id {split!r} of {source} is not <topic>:<partition> (a Kafka topic name of "
            "letters, digits, '.', '_' or '-' and a partition number); split ids are restored "
            "from checkpoints, so that one was tampered with: restore another checkpoint"
        )
    return match[1], int(match[2])


def encode_position(next_offset: int | None, stop: int | None = None) -> bytes:
    """The position after a read: the next offset, and the stop offset in bounded mode."""
    if next_offset is None:
        return b""
    return f"{next_offset}/{stop}".encode() if stop is not None else str(next_offset).encode()


def decode_position(position: bytes, split: str) -> tuple[int | None, int | None]:
    """(next offset, stop offset) of a stored position; None for what it does not hold yet."""
    if not position:
        return None, None
    match = _POSITION.fullmatch(position)
    if match is None:
        raise MetadataError(
            f"position {position[:40]!r} of Kafka split {split!r} is not <offset> or "
            "<offset>/<stop offset>; positions are restored from checkpoints, so that one was "
            "tampered with: restore another checkpoint"
        )
    return int(match[1]), int(match[2]) if match[2] is not None else None


def decode_value(
    data: bytes | None, decoder: Decoder, topic: str, partition: int, offset: int
) -> Any:
    """A record's key or value as `decoder` says; None stays None. A record that does not
    decode raises `KafkaSourceError` naming it (its unit declines until the data is fixed)."""
    if data is None or decoder == "bytes":
        return data
    try:
        if decoder == "utf-8":
            return data.decode("utf-8")
        if decoder == "json":  # nesting bounded before parsing; a broker bounds the size
            return json_text.decode(data, _JSON_BOUNDS)
        return decoder(data)
    except Exception as exc:
        how = decoder if isinstance(decoder, str) else getattr(decoder, "__name__", "decoder")
        raise KafkaSourceError(
            f"record at offset {offset} of topic {topic!r} partition {partition} does not "
            f"decode as {how} ({type(exc).__name__}: {exc}); fix the producer or pass a "
            "decoder that accepts it (value=... / key=...)"
        ) from None


#: What a JSON value may be: nested 64 levels at most (`regional.sources.json_text`); its size
#: is the broker's to bound (`message.max.bytes`).
_JSON_BOUNDS = json_text.JsonBounds(max_bytes=sys.maxsize)


def _text(data: bytes | None) -> str | None:
    """Raw record bytes as text for a dead letter (undecodable bytes escaped)."""
    return None if data is None else data.decode("utf-8", "backslashreplace")


def unread_since(first_unread: Message | None, last_read: Message | None) -> int | None:
    """When the oldest record a read left unread was appended (ms, `ReadResult.unread_since`):
    its own timestamp when the read's fetch brought it (`first_unread`), else the last read
    record's, a time no later than it (Kafka stamps a partition's records in order when the
    topic uses LogAppendTime; with CreateTime, in the producers' order), so the consumer lag
    in time shown is then at most the gap between the two records too high. None when
    neither record has a timestamp."""
    for m in (first_unread, last_read):
        if m is not None:
            kind, ms = m.timestamp()
            if kind != 0 and ms is not None and ms >= 0:  # 0: TIMESTAMP_NOT_AVAILABLE
                return int(ms)
    return None


def out_of_range(topic: str, partition: int, offset: int, low: int, high: int) -> str:
    """The error text for a stored offset the partition no longer has."""
    if offset > high:
        why = (
            "past the partition's end: the topic was deleted and recreated, or the checkpoint "
            "belongs to another cluster; start the job fresh (or restore a checkpoint of this "
            "topic)"
        )
    else:
        why = (
            f"the records before offset {low} were deleted (retention) before this job read "
            "them; raise the topic's retention, or start the job fresh and accept the gap"
        )
    return (
        f"offset {offset} of topic {topic!r} partition {partition} is out of range (the broker "
        f"keeps offsets {low}..{high}): {why}"
    )


def _check_decoder(name: str, decoder: Decoder) -> None:
    if not callable(decoder) and decoder not in ("bytes", "utf-8", "json"):
        raise ValueError(
            f"KafkaSource {name}={decoder!r} is unknown; use 'bytes', 'utf-8', 'json' or a "
            "function of the bytes"
        )


# --- consumers: one per (process, bootstrap, settings), reused by every read --------------------

_consumers: dict[tuple[tuple[str, str], ...], tuple[Consumer, threading.Lock]] = {}
_consumers_lock = threading.Lock()


@contextlib.contextmanager
def _consumer(settings: Mapping[str, str]) -> Iterator[Consumer]:
    """This process's consumer for `settings`, held exclusively; dropped (closed) when a read
    through it fails, so the next read starts from a fresh connection."""
    try:
        from confluent_kafka import Consumer
    except ImportError as exc:
        raise KafkaSourceError(
            f"the Kafka source needs confluent-kafka ({exc}); {_INSTALL}"
        ) from None
    key = tuple(sorted(settings.items()))
    with _consumers_lock:
        if key not in _consumers:
            consumer = Consumer(dict(settings), logger=log)  # librdkafka logs go to logging
            _consumers[key] = (consumer, threading.Lock())
        consumer, lock = _consumers[key]
    with lock:
        try:
            yield consumer
        except BaseException:
            with _consumers_lock:
                _consumers.pop(key, None)
            with contextlib.suppress(Exception):
                consumer.close()
            raise


# --- the source ---------------------------------------------------------------------------------


class KafkaSource:
    """Every partition of `topic` / `topics` / the topics matching `pattern` at `bootstrap`.

    Records have the columns topic, partition, offset, timestamp (ms since the epoch, None when
    the broker gives none), key and value (decoded by `key` / `value`: 'bytes', 'utf-8', 'json'
    or a function of the bytes) and headers (a list of {key, value}). `start` is where a split
    never read before begins ('earliest' or 'latest'). With `bounded=True` each partition is
    read up to its end offset at the split's first read and the source then finishes.
    `timeout` (seconds) bounds each broker request and `poll_timeout` one empty poll.
    `config` adds librdkafka settings (security, client.id, ...). `commit_group`, when set,
    commits the offsets of the last completed checkpoint to that consumer group for lag tools
    (never read back)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str | None = None,
        *,
        topics: Sequence[str] = (),
        pattern: str | None = None,
        value: Decoder = "bytes",
        key: Decoder = "bytes",
        start: Literal["earliest", "latest"] = "earliest",
        bounded: bool = False,
        timeout: float = 10.0,
        poll_timeout: float = 1.0,
        config: Mapping[str, str] | None = None,
        commit_group: str | None = None,
    ) -> None:
        named = ([topic] if topic is not None else []) + list(topics)
        if bool(named) == (pattern is not None):
            raise ValueError("KafkaSource needs topic=, topics= or pattern= (exactly one kind)")
        for t in named:
            if _SPLIT.fullmatch(f"{t}:0") is None:
                raise ValueError(
                    f"KafkaSource topic {t!r} is not a Kafka topic name (1-249 letters, digits, "
                    "'.', '_' or '-')"
                )
        if start not in ("earliest", "latest"):
            raise ValueError(f"KafkaSource start={start!r} is unknown; use 'earliest' or 'latest'")
        _check_decoder("value", value)
        _check_decoder("key", key)
        self.bootstrap = bootstrap
        self.topics = tuple(dict.fromkeys(named))
        self.pattern = pattern
        self._regex = re.compile(pattern) if pattern is not None else None
        self.value = value
        self.key = key
        self.start = start
        self._bounded = bounded
        self.timeout = timeout
        self.poll_timeout = poll_timeout
        self.config = dict(config or {})
        self.commit_group = commit_group

    @property
    def bounded(self) -> bool:
        return self._bounded

    @property
    def endless_splits(self) -> bool:
        """Unbounded, a partition never finishes (`regional.sources.base.endless_splits`)."""
        return not self._bounded

    def __repr__(self) -> str:
        what = f"pattern={self.pattern!r}" if self.pattern is not None else f"topics={self.topics}"
        return f"KafkaSource({self.bootstrap!r}, {what})"

    # --- settings ---

    def _settings(self) -> dict[str, str]:
        ms = str(max(1, int(self.timeout * 1000)))
        return {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.commit_group or "regional",
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
            "enable.partition.eof": "true",
            "auto.offset.reset": "error",  # an offset out of range is an error, never a skip
            "allow.auto.create.topics": "false",
            "socket.timeout.ms": ms,
            "fetch.wait.max.ms": "10",  # an idle partition answers at once, a reassignment too
            "reconnect.backoff.max.ms": "1000",
            "log_level": "2",  # connection errors surface as KafkaSourceError instead
            **self.config,
        }

    def _where(self) -> str:
        return f"the Kafka source at {self.bootstrap}"

    def _unreachable(self, what: str, exc: Exception) -> KafkaSourceError:
        return KafkaSourceError(
            f"cannot reach Kafka at {self.bootstrap} ({exc}) {what}: check the bootstrap "
            "address and that the brokers run; meanwhile the units reading it decline and "
            "fall back to their last checkpoint"
        )

    def _partitions(self, consumer: Consumer, topic: str | None, what: str) -> dict[str, list[int]]:
        """topic -> partition numbers, from the brokers' metadata (one topic, or every one)."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            meta = consumer.list_topics(topic, timeout=self.timeout)
        except KafkaException as exc:
            raise self._unreachable(what, exc) from None
        out = {}
        for name, t in meta.topics.items():
            if t.error is not None and t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            if t.error is not None:
                raise KafkaSourceError(
                    f"Kafka at {self.bootstrap} cannot describe topic {name!r} ({t.error.str()}) "
                    f"{what}: check the topic and this client's permissions"
                )
            out[name] = sorted(t.partitions)
        return out

    # --- driver side ---

    def discover(self) -> list[str]:
        """A split per partition of every topic read (missing named topics are an error)."""
        with _consumer(self._settings()) as consumer:
            if self._regex is not None:
                found = self._partitions(consumer, None, "listing topics")
                return [
                    split_id(t, p)
                    for t in sorted(found)
                    if self._regex.fullmatch(t)
                    for p in found[t]
                ]
            splits = []
            for topic in self.topics:
                found = self._partitions(consumer, topic, f"listing topic {topic!r}")
                if topic not in found:
                    raise KafkaSourceError(
                        f"topic {topic!r} does not exist at Kafka {self.bootstrap}: create it "
                        "(or fix the name) before starting the job"
                    )
                splits += [split_id(topic, p) for p in found[topic]]
            return splits

    # --- task side ---

    def _check_topic(self, topic: str, split: str) -> None:
        if topic in self.topics or (self._regex is not None and self._regex.fullmatch(topic)):
            return
        raise MetadataError(
            f"split id {split!r} of {self._where()} names topic {topic!r}, which this source does "
            "not read; split ids are restored from checkpoints, so that one was tampered with or "
            "comes from another pipeline: restore another checkpoint"
        )

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

        topic, partition = parse_split_id(split_id, self._where())
        self._check_topic(topic, split_id)
        next_offset, stop = decode_position(position, split_id)
        at = (
            f"reading topic {topic!r} partition {partition} from offset {next_offset or self.start}"
        )
        with _consumer(self._settings()) as consumer:
            found = self._partitions(consumer, topic, at)
            if topic not in found:
                raise KafkaSourceError(
                    f"topic {topic!r} no longer exists at Kafka {self.bootstrap} ({at}): it was "
                    "deleted; recreate it, or start the job fresh without this checkpoint"
                )
            if partition not in found[topic]:
                raise KafkaSourceError(
                    f"partition {partition} of topic {topic!r} no longer exists at Kafka "
                    f"{self.bootstrap} ({at}; the topic has partitions "
                    f"{found[topic][0]}..{found[topic][-1]}): it was deleted; recreate the topic "
                    "with enough partitions, or start the job fresh"
                )
            tp = TopicPartition(topic, partition)
            if self._bounded and stop is None:
                stop = self._watermarks(consumer, tp, at)[1]
            if self.commit_group is not None and next_offset is not None:
                self._commit_back(consumer, topic, partition, next_offset)
            if stop is not None and (next_offset or 0) >= stop:
                return ReadResult([], encode_position(next_offset or stop, stop), True, (), 0)
            if next_offset is not None:
                tp.offset = next_offset
            else:
                tp.offset = OFFSET_BEGINNING if self.start == "earliest" else OFFSET_END
            want = max_records if stop is None else min(max_records, stop - (next_offset or 0))
            messages, peeked = (
                self._poll(consumer, tp, want, next_offset, stop, at) if want > 0 else ([], None)
            )
            if messages:
                next_offset = int(messages[-1].offset() or 0) + 1
            # consumer lag: the partition's end offset now, minus where the next read starts
            low, high = self._watermarks(consumer, tp, at, fetched=True)
        finished = stop is not None and next_offset is not None and next_offset >= stop
        good, poison = self._decode(messages)
        batches = [self._batch(*good)] if good[0] else []
        start = low if self.start == "earliest" else high  # where a first read starts
        behind = max(high - (start if next_offset is None else next_offset), 0)
        since = unread_since(peeked, messages[-1] if messages else None) if behind else None
        return ReadResult(
            batches, encode_position(next_offset, stop), finished, poison, behind, since
        )

    def _decode(
        self, messages: list[Message]
    ) -> tuple[tuple[list[Message], list[Any], list[Any]], tuple[PoisonRecord, ...]]:
        """The messages whose key and value decode, with their decoded keys and values, and
        the others as poison records (each with its topic, partition, offset, key and value
        as text, and the decode error)."""
        good: list[Message] = []
        keys: list[Any] = []
        values: list[Any] = []
        poison: list[PoisonRecord] = []
        for i, m in enumerate(messages):
            where = str(m.topic()), int(m.partition() or 0), int(m.offset() or 0)
            try:
                key = decode_value(m.key(), self.key, *where)
                value = decode_value(m.value(), self.value, *where)
            except KafkaSourceError as exc:
                topic, partition, offset = where
                record = {
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    "key": _text(m.key()),
                    "value": _text(m.value()),
                }
                poison.append(PoisonRecord(i, record, exc))
            else:
                good.append(m)
                keys.append(key)
                values.append(value)
        return (good, keys, values), tuple(poison)

    def _watermarks(
        self, consumer: Consumer, tp: Any, at: str, *, fetched: bool = False
    ) -> tuple[int, int]:
        """(low, high) offsets of `tp`. With `fetched`, the ones this read's fetch brought
        when it brought both (no round trip), else asked of the broker."""
        from confluent_kafka import KafkaException

        if fetched:
            low, high = consumer.get_watermark_offsets(tp, cached=True) or (None, None)
            if low is not None and high is not None and 0 <= low <= high:
                return int(low), int(high)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=self.timeout, cached=False)
        except KafkaException as exc:
            raise self._unreachable(at, exc) from None
        return int(low), int(high)

    def _poll(
        self,
        consumer: Consumer,
        tp: Any,
        want: int,
        next_offset: int | None,
        stop: int | None,
        at: str,
    ) -> tuple[list[Message], Message | None]:
        """Up to `want` records of `tp` from its offset; returns early at the partition's end
        or on an empty poll, so an idle partition costs one short poll. With them, the record
        right after the last one when this read's fetch already brought it (a non-blocking
        look into the consumer's queue, no broker round trip; None otherwise): its timestamp
        is the consumer lag's time (`unread_since`)."""
        from confluent_kafka import KafkaError

        consumer.assign([tp])
        try:
            out: list[Message] = []
            while len(out) < want:
                m = consumer.poll(self.poll_timeout)
                if m is None:
                    break  # an empty poll ends this split's epoch
                mine = m.topic() == tp.topic and m.partition() == tp.partition
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if mine:
                            break  # the end of the partition ends it too
                        continue
                    self._raise_for(err, consumer, tp, next_offset, at)
                offset = int(m.offset() or 0)
                if not mine or (next_offset is not None and offset < next_offset):
                    continue  # left over from an earlier assignment
                if stop is not None and offset >= stop:
                    break
                out.append(m)
                high = consumer.get_watermark_offsets(tp, cached=True)[1]  # from the fetch
                if high is not None and 0 <= high <= offset + 1:
                    break  # caught up: no need to wait for the end-of-partition event
            if not out and next_offset is not None:  # some brokers answer a bad offset with
                low, high = consumer.get_watermark_offsets(tp, cached=True)  # nothing at all
                if low is not None and high is not None and 0 <= high < next_offset:
                    raise KafkaSourceError(
                        out_of_range(tp.topic, tp.partition, next_offset, low, high)
                    )
            return out, self._peek(consumer, tp, out) if len(out) == want else None
        finally:
            consumer.unassign()  # drops the peeked record: the next read seeks afresh

    @staticmethod
    def _peek(consumer: Consumer, tp: Any, out: list[Message]) -> Message | None:
        """The record after `out[-1]` if the consumer's queue holds it now (poll(0) never
        waits), else None."""
        m = consumer.poll(0)
        if m is None or m.error() is not None or not out:
            return None
        mine = m.topic() == tp.topic and m.partition() == tp.partition
        return m if mine and m.offset() == int(out[-1].offset() or 0) + 1 else None

    def _raise_for(
        self, err: Any, consumer: Consumer, tp: Any, offset: int | None, at: str
    ) -> None:
        from confluent_kafka import KafkaError

        if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            low, high = self._watermarks(consumer, tp, at)
            raise KafkaSourceError(out_of_range(tp.topic, tp.partition, offset or 0, low, high))
        if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION):
            raise KafkaSourceError(
                f"partition {tp.partition} of topic {tp.topic!r} no longer exists at Kafka "
                f"{self.bootstrap} ({at}): it was deleted; recreate it, or start the job fresh"
            )
        raise KafkaSourceError(
            f"Kafka at {self.bootstrap} failed {at} ({err.str()}); the unit declines and falls "
            "back to its last checkpoint, and reads again next epoch"
        )

    def _commit_back(self, consumer: Consumer, topic: str, partition: int, offset: int) -> None:
        """Copy a checkpointed offset (the position this unit restored) to `commit_group`;
        best effort: lag tools only read it."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            consumer.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
        except KafkaException as exc:
            log.warning("Kafka commit of %s:%d@%d failed: %s", topic, partition, offset, exc)

    def _batch(self, messages: list[Message], keys: list[Any], values: list[Any]) -> Batch:
        """The decoded `messages` (with their decoded `keys` and `values`) as one batch; as
        records (dicts of the same columns) when Arrow cannot type the JSON as one column (a
        field of two types across messages, ``"n/a"`` among numbers), so a declared schema
        judges each record on its own (a misfit is a dead letter naming the field) instead
        of the whole batch declining its unit at every retry."""
        try:
            return self._arrow_batch(messages, keys, values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            if "json" not in (self.key, self.value):
                raise
        return [
            {
                "topic": m.topic(),
                "partition": m.partition(),
                "offset": m.offset(),
                "timestamp": m.timestamp()[1] if m.timestamp()[0] else None,
                "key": k,
                "value": v,
                "headers": [{"key": h[0], "value": h[1]} for h in m.headers() or ()],
            }
            for m, k, v in zip(messages, keys, values, strict=True)
        ]

    def _arrow_batch(
        self, messages: list[Message], keys: list[Any], values: list[Any]
    ) -> pa.RecordBatch:
        """`_batch` as one Arrow batch (`pa.ArrowInvalid` when JSON values do not type)."""

        def typed(decoder: Decoder, values: list[Any]) -> pa.Array:
            if decoder == "bytes":
                return pa.array(values, pa.binary())
            if decoder == "utf-8":
                return pa.array(values, pa.string())
            return pa.array(values)

        stamps = [m.timestamp() for m in messages]
        columns = {
            "topic": pa.array([m.topic() for m in messages], pa.string()),
            "partition": pa.array([m.partition() for m in messages], pa.int32()),
            "offset": pa.array([m.offset() for m in messages], pa.int64()),
            "timestamp": pa.array([ms if kind else None for kind, ms in stamps], pa.int64()),
            "key": typed(self.key, keys),
            "value": typed(self.value, values),
            "headers": pa.array(
                [[{"key": h[0], "value": h[1]} for h in m.headers() or ()] for m in messages],
                HEADERS_TYPE,
            ),
        }
        return pa.RecordBatch.from_pydict(columns)
