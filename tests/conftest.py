"""Shared fixtures: a loopback S3-compatible server (moto) and the local SparkSession for the
whole session, and a standalone Spark cluster (`cluster.py`) per module that uses it.

Servers are started by the tests themselves on 127.0.0.1 and stopped at the end.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """A running moto server: `endpoint` (host:port) and a helper to make fresh buckets."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.endpoint = f"{host}:{port}"

    def filesystem(self):  # -> pyarrow.fs.S3FileSystem
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key="testing",
            secret_key="testing",
            endpoint_override=self.endpoint,
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )

    def new_bucket(self) -> str:
        """Create an empty bucket with a unique name and return its name."""
        name = f"test-{uuid.uuid4().hex[:12]}"
        self.filesystem().create_dir(name)
        return name

    def uri(self, bucket: str, path: str = "") -> str:
        """An `s3://` URI that pyarrow.fs.FileSystem.from_uri resolves to this server."""
        suffix = f"/{path.strip('/')}" if path else ""
        return (
            f"s3://testing:testing@{bucket}{suffix}"
            f"?endpoint_override={self.endpoint}&scheme=http&region=us-east-1"
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, for the whole test session."""
    import os

    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Server("127.0.0.1", port)
    finally:
        server.stop()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before the first test, when any needs Spark: faster driver JVM starts
    (`jvm_startup`), for the shared session and every `regional run` a test starts."""
    if any(item.get_closest_marker("spark") for item in session.items):
        from jvm_startup import prepare

        prepare()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Take up the JVM archive once its background dump has ended (`jvm_startup`)."""
    import jvm_startup

    jvm_startup.refresh()


@pytest.fixture(scope="session")
def spark():  # -> pyspark.sql.SparkSession
    """One quiet local[2] SparkSession for every Spark test of the session."""
    from regional.runtime.session import spark_session

    session = spark_session("local[2]", app_name="regional-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):  # -> cluster.StandaloneCluster
    """A standalone Spark master + worker (2 cores, 1 GiB) on loopback, shared by the tests of
    a module and stopped after them (two idle JVMs would slow the rest of the suite)."""
    from cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture
def no_policy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own REGIONAL_ variables must not leak into a test of bad input
    (`pytestmark = pytest.mark.usefixtures("no_policy_env")`)."""
    for name in list(os.environ):
        if name.startswith("REGIONAL_"):
            monkeypatch.delenv(name)


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if `regional run` gets as far as starting Spark."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Spark was started for input known to be bad before it starts")

    monkeypatch.setattr("regional.runtime.session.spark_context", refuse)
