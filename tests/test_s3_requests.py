"""Requests per checkpoint on the S3-compatible test server (moto on loopback, every request
counted as `benchmarks.bench_s3_requests` counts them): no LIST on the steady-state path of an
epoch, and a checkpoint root's PUT+GET+HEAD per checkpoint that follows Spark tasks, not
regions. The lease's own steady state (check, renew, release) lists nothing either.
"""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from benchmarks.s3_counting import RequestCounter, start_server, uri
from metadata.lease import JobLease
from metadata.storage import JobStorage

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def counted() -> Iterator[tuple[RequestCounter, str]]:
    """A moto server of this module's own, its requests counted: (counter, endpoint)."""
    server, counter, endpoint = start_server()
    try:
        yield counter, endpoint
    finally:
        server.stop()


def _bucket(endpoint: str) -> str:
    from pyarrow import fs

    name = f"req-{uuid.uuid4().hex[:12]}"
    fs.S3FileSystem(
        access_key="testing", secret_key="testing", endpoint_override=endpoint,
        scheme="http", region="us-east-1", allow_bucket_creation=True,
    ).create_dir(name)  # fmt: skip
    return name


def _delta(
    before: collections.Counter[tuple[str, str]],
    after: collections.Counter[tuple[str, str]],
    bucket: str,
) -> dict[str, int]:
    kinds = {k for b, k in after if b == bucket}
    return {k: after[bucket, k] - before[bucket, k] for k in kinds}


def test_the_lease_checks_renews_and_releases_without_listing(counted):
    counter, endpoint = counted
    bucket = _bucket(endpoint)
    storage = JobStorage(uri(endpoint, bucket, "root"), "job")
    lease = JobLease(storage, "run-a", ttl_ms=60_000, clock=lambda: time.time_ns() // 10**6)
    lease.acquire()  # may list: at a driver's start
    before = counter.snapshot()
    for _ in range(3):
        lease.check()
        lease.renew()
    lease.release()
    spent = _delta(before, counter.snapshot(), bucket)
    assert spent.get("LIST", 0) == 0, [q for b, q in counter.lists if b == bucket]
    # a check: HEAD g<N+1>.json, then its own g<N>.json read (pyarrow: HEAD + GET)
    assert spent["HEAD"] >= 3 * 2 * 2 and spent["GET"] >= 3 * 2


def _record(split: int, n: int) -> dict[str, int]:
    return {"s": split, "n": n}


def _count(ctx: Any, r: dict[str, int]) -> Iterable[dict[str, int]]:
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {"s": r["s"], "n": r["n"], "c": c.value()}


def _steady_state(spark: Any, endpoint: str, counter: RequestCounter, regions: int) -> dict:
    """A keyed count over `regions` regions on 2 Spark tasks, checkpoint root and Parquet table
    on S3: requests on the checkpoint root per checkpoint over 3 epochs after 2 warm-up ones
    (the first checkpoints, the cleaner's full scan), background cleaning drained after each."""
    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.spark import SparkRuntime
    from regional.sinks.parquet import ParquetSink
    from regional.sources.generator import GeneratorSource

    ckpt, table = _bucket(endpoint), _bucket(endpoint)
    p = Pipeline(f"req-{regions}", records_per_epoch=4)
    src = p.source(GeneratorSource(regions, _record), parallelism=regions)
    src.key_by(lambda r: r["s"]).process(_count).sink(ParquetSink(uri(endpoint, table, "t")))
    # the restore path reads the state files: with hot state, whether a task's units find their
    # state in the worker depends on which Python worker Spark hands the task (a hit reads
    # nothing), which no request count should
    rt = SparkRuntime(
        p,
        spark,
        root=uri(endpoint, ckpt, "root"),
        tasks=2,
        merge_state=True,
        hot_state=False,
    )
    rt.lease.ttl_ms = 600_000  # no renewal falls in the window: both sizes measure the same
    rt.start()
    try:
        for _ in range(2):
            rt.epoch()
            rt.cleaning.drain()
        before, lists = counter.snapshot(), len(counter.lists)
        for _ in range(3):
            assert rt.epoch().kind != "aborted"
            rt.cleaning.drain()
        spent = _delta(before, counter.snapshot(), ckpt)
        listed = [q for b, q in counter.lists[lists:] if b == ckpt]
    finally:
        rt.cleaning.close()
        rt.lease.release()
    return {"per_checkpoint": {k: v / 3 for k, v in spent.items()}, "lists": listed}


@pytest.mark.spark
def test_no_list_on_the_steady_state_path_and_requests_follow_tasks_not_regions(spark, counted):
    counter, endpoint = counted
    small = _steady_state(spark, endpoint, counter, regions=8)
    large = _steady_state(spark, endpoint, counter, regions=32)
    for run in (small, large):
        assert run["lists"] == [], f"LISTs on the checkpoint root: {run['lists']}"

    def reads_and_writes(run: dict) -> float:
        return sum(run["per_checkpoint"].get(k, 0) for k in ("PUT", "GET", "HEAD"))

    assert reads_and_writes(large) <= reads_and_writes(small), (small, large)
