"""The job's metrics for Prometheus (`regional run --metrics-port`, `SparkRuntime(metrics_port=
...)`), served over HTTP while the driver runs. Needs the optional `prometheus-client`
(`pip install 'regional-checkpoints[prometheus]'`).

Every scrape reads the `MetricsSnapshot` the driver published after its latest epoch
(`MetricsSource.published_metrics`) and the driver's clock (how long stuck units have been
stuck), nothing else of the driver: a scrape on the server's thread never reads state the
driver's thread is changing, and nothing is copied between scrapes. A dedicated
`CollectorRegistry` (not the process-wide one) holds only this job's metrics; the server binds
to 127.0.0.1 unless told otherwise. Names follow Flink's and FLIP-600's where they exist (README
"Metrics" maps them), in Prometheus's style: base units, `_total` on counters, every sample
labelled with the job id. Counters start at 0 when a driver starts (also after a restore), as
Prometheus expects of a restarted process.

A unit's samples carry its id (`unit`, stable for dashboards and what `Faults` and the grid
take) and its name (`name`: what it reads, `regional.graph.unit_names`, ``orders[1]``). A
watermark no record has set yet is exported as NaN (unknown), one whose input ended as +Inf.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from metadata.errors import RegionalError
from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK
from regional.runtime.metrics import MetricsSnapshot, MetricsSource

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "JobCollector",
    "MetricsPortError",
    "job_registry",
    "serve_metrics",
    "watermark_seconds",
]


def _by_label(
    name: str, text: str, job: list[str], label: str, counts: Mapping[str, int]
) -> Metric:
    """A counter family of `job` with one sample per value of `label` (`counts`)."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, text, labels=["job", label])
    for value, n in counts.items():
        family.add_metric([*job, value], n)
    return family


def _by_split(
    name: str, text: str, job: list[str], values: Mapping[str, Mapping[str, float]]
) -> Metric:
    """A gauge family of `job` with one sample per (source, split) (`values`: source ->
    split -> value): the consumer lag families."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, text, labels=["job", "source", "split"])
    for source, splits in values.items():
        for split, value in splits.items():
            family.add_metric([*job, source, split], value)
    return family


def watermark_seconds(ms: int) -> float:
    """A watermark as the gauge shows it: seconds since the Unix epoch; NaN when no record set
    it yet (`MIN_WATERMARK`: unknown, not a time 292 million years ago), +Inf once its input
    ended (`MAX_WATERMARK`).

    >>> watermark_seconds(5_000), watermark_seconds(MIN_WATERMARK), watermark_seconds(MAX_WATERMARK)
    (5.0, nan, inf)
    """
    if ms <= MIN_WATERMARK:
        return math.nan
    if ms >= MAX_WATERMARK:
        return math.inf
    return ms / 1000


class MetricsPortError(RegionalError):
    """The metrics endpoint cannot be served (the port is taken, the address is not local)."""

    exit_code = 2


class JobCollector:
    """A Prometheus collector over one job's published metrics: `snapshot` gives the latest
    (read once per scrape), `now_ms` the driver's clock, `names` each unit's name (unit id ->
    ``orders[1]``; a unit left out is ``unit <id>``)."""

    def __init__(
        self,
        snapshot: Callable[[], MetricsSnapshot],
        now_ms: Callable[[], int],
        names: Mapping[int, str] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.now_ms = now_ms
        self.names = names or {}

    def _name(self, unit: int | None) -> str:
        return "" if unit is None else self.names.get(unit, f"unit {unit}")

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m = self.snapshot()
        job = [m.job_id]
        yield _by_label(
            "regional_checkpoints",
            "Completed checkpoints by kind since the driver started (Flink "
            "numberOfCompletedCheckpoints; FLIP-600 global/regional checkpoint counts).",
            job,
            "kind",
            {
                "global": m.global_checkpoint_count,
                "regional": m.regional_checkpoint_count,
                "savepoint": m.savepoint_count,
            },
        )
        yield _by_label(
            "regional_checkpoints_aborted",
            "Aborted checkpoints by the DESIGN rule that aborted them (Flink "
            "numberOfFailedCheckpoints).",
            job,
            "rule",
            m.aborted_by_rule,
        )
        records = CounterMetricFamily(
            "regional_records_in",
            "Records read by the sources (Flink numRecordsIn).",
            labels=["job"],
        )
        records.add_metric(job, m.records_in)
        yield records
        if m.event_time:
            late = CounterMetricFamily(
                "regional_records_late",
                "Records judged late in completed checkpoints, once per operator that judged "
                "them: windows (behind the watermark past the allowed lateness), interval and "
                "temporal joins and drop_duplicates (below their origin watermark).",
                labels=["job"],
            )
            late.add_metric(job, m.records_late)
            yield late
        per_operator = [
            ("in", 0, "Records an operator took in, by operator (Flink numRecordsIn)."),
            ("out", 1, "Records an operator gave out, by operator (Flink numRecordsOut)."),
        ]
        if m.event_time:
            per_operator.append(
                ("late", 2, "Records an operator judged late, by operator (windows, joins, "
                 "drop_duplicates).")
            )  # fmt: skip
        for which, k, text in per_operator:
            family = CounterMetricFamily(
                f"regional_operator_records_{which}",
                text + " Counted for the units fresh in completed checkpoints.",
                labels=["job", "operator"],
            )
            for operator, counts in m.operator_records.items():
                family.add_metric([*job, operator], counts[k])
            yield family
        yield _by_label(
            "regional_dead_letters",
            "Records set aside to the dead-letter sink in completed checkpoints, by reason "
            "(late, bad event time, undecodable, user function error).",
            job,
            "reason",
            m.dead_letters_by_reason,
        )
        yield _by_split(
            "regional_source_records_behind",
            "Consumer lag: records between where the job's next read of a split starts and the "
            "split's end (a Kafka partition's end offset, a file's rows), as the latest "
            "completed checkpoint's units read it (Flink records-lag).",
            job,
            m.records_behind,
        )
        yield _by_split(
            "regional_source_consumer_lag_seconds",
            "Consumer lag in time: the age of the oldest record of a split not read yet at the "
            "latest checkpoint outcome (0 when none is behind), for splits whose source tells "
            "when records were appended (a Kafka record's timestamp, a file's modification "
            "time; regional.sources.base.seconds_behind).",
            job,
            m.seconds_behind,
        )
        if m.event_time:
            stalled = GaugeMetricFamily(
                "regional_stalled_input",
                "1 for each operator input whose watermark has not advanced for "
                "event-time.stall-after checkpoints while the operator's state grew "
                "(regional.runtime.stalled_inputs); only inputs stalled now.",
                labels=["job", "operator", "input"],
            )
            for operator, name in m.stalled_inputs:
                stalled.add_metric([*job, operator, name], 1)
            yield stalled
        failures = CounterMetricFamily(
            "regional_commit_failures", "Failed commit attempts (retried).", labels=["job"]
        )
        failures.add_metric(job, m.commit_failures)
        yield failures
        commit_lag = GaugeMetricFamily(
            "regional_commit_lag",
            "Completed checkpoints whose output is not committed yet.",
            labels=["job"],
        )
        commit_lag.add_metric(job, m.commit_lag)
        yield commit_lag
        lag = GaugeMetricFamily(
            "regional_unit_lag",
            "Checkpoint ids a unit's state is behind the latest completed one (units that lag "
            "only; aborted attempts count: the unit committed nothing in them either).",
            labels=["job", "unit", "name"],
        )
        for unit, behind in m.unit_lag.items():
            lag.add_metric([*job, str(unit), self._name(unit)], behind)
        yield lag
        stuck_units = m.stuck_units
        count = GaugeMetricFamily(
            "regional_stuck_units",
            "Units over max-unit-fallbacks that checkpoints complete without (stuck; the job "
            "fails once one stays stuck longer than max-stuck-time).",
            labels=["job"],
        )
        count.add_metric(job, len(stuck_units))
        yield count
        stuck = GaugeMetricFamily(
            "regional_unit_stuck_seconds",
            "How long each stuck unit has been stuck, by unit and what it reads (stuck units "
            "only).",
            labels=["job", "unit", "name", "reads"],
        )
        now = self.now_ms()
        for s in stuck_units:
            stuck.add_metric(
                [*job, str(s.unit_id), self._name(s.unit_id), ",".join(s.splits)],
                (now - s.since_ms) / 1000,
            )
        yield stuck
        if m.latest_completed_id is not None:
            latest = GaugeMetricFamily(
                "regional_latest_completed_checkpoint_id",
                "The newest completed checkpoint (Flink lastCompletedCheckpointId).",
                labels=["job"],
            )
            latest.add_metric(job, m.latest_completed_id)
            yield latest
            oldest = GaugeMetricFamily(
                "regional_oldest_ref_checkpoint_id",
                "The oldest checkpoint whose state the latest completed checkpoint refers to "
                "(FLIP-600 oldestRefCheckpointId; the latest itself when it is global).",
                labels=["job"],
            )
            ref = m.oldest_ref_checkpoint_id
            oldest.add_metric(job, m.latest_completed_id if ref is None else ref)
            yield oldest
        if m.watermark_ms is not None:
            wm = GaugeMetricFamily(
                "regional_watermark_seconds",
                "The lowest event-time watermark of a unit fresh in the latest checkpoint "
                "(seconds since the Unix epoch; NaN: no record set it yet; +Inf: its input "
                "ended), and the unit.",
                labels=["job", "unit", "name"],
            )
            wm.add_metric(
                [*job, str(m.watermark_unit), self._name(m.watermark_unit)],
                watermark_seconds(m.watermark_ms),
            )
            yield wm
        if m.last_checkpoint_seconds is not None:
            duration = GaugeMetricFamily(
                "regional_last_checkpoint_duration_seconds",
                "From the latest checkpoint's trigger to its outcome (Flink "
                "lastCheckpointDuration, in seconds).",
                labels=["job"],
            )
            duration.add_metric(job, m.last_checkpoint_seconds)
            yield duration


def job_registry(
    source: MetricsSource, names: Mapping[int, str] | None = None
) -> CollectorRegistry:
    """A registry of its own holding only the metrics `source` (a `JobDriver`) publishes,
    units named by `names`."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(source.published_metrics, source.now_ms, names))
    return registry


@contextlib.contextmanager
def serve_metrics(
    source: MetricsSource,
    *,
    port: int,
    host: str = "127.0.0.1",
    names: Mapping[int, str] | None = None,
) -> Iterator[int]:
    """Serve the metrics `source` (a `JobDriver`) publishes on http://HOST:PORT/metrics while
    the block runs, units named by `names`; yields the port (0 picks a free one). Raises
    `MetricsPortError` when the port cannot be bound."""
    try:
        from prometheus_client import start_http_server
    except ImportError as exc:
        raise MetricsPortError(
            "the metrics endpoint needs prometheus-client: "
            "pip install 'regional-checkpoints[prometheus]'"
        ) from exc
    try:
        server, thread = start_http_server(port, addr=host, registry=job_registry(source, names))
    except OSError as exc:
        raise MetricsPortError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; pick a free port "
            "(--metrics-port) or stop what uses it"
        ) from exc
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
