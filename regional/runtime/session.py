"""One quiet SparkSession for running pipelines (research/spark.md §4, §6 pitfall 14).

Spark's own log lines stay off the terminal: a log4j2 file shipped with the package sets every
logger to ERROR (including `PythonGatewayServer`, which would otherwise reset the root level to
WARN), the console progress bar and the web UI are off, and the driver binds to 127.0.0.1. With
`log_file`, the JVM's stdout/stderr (and the Python workers') go to that file instead of the
terminal, so not even the JVM's own `WARNING: Using incubator modules` line shows.
Workers run the same interpreter as the driver, so they import the same `regional`.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "quiet_conf", "spark_session"]

DEFAULT_MASTER = "local[*]"


def _log4j_file() -> str:
    return str(resources.files("regional.runtime") / "log4j2-quiet.properties")


def quiet_conf(*, verbose: bool = False) -> dict[str, str]:
    """The Spark settings for a quiet local session (ERROR-only logs unless `verbose`)."""
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # A cancelled region task's Python worker is killed within ~1 s, not ~3 s (§1.3).
        "spark.python.task.killTimeout": "100ms",
        # No Spark-level retries: a region attempt runs once; the coordinator decides (rule 9).
        "spark.task.maxFailures": "1",
    }
    if not verbose:
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_log4j_file()}"
    return conf


def spark_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "regional",
    verbose: bool = False,
    log_file: str | None = None,
    extra: dict[str, Any] | None = None,
) -> SparkSession:
    """Get or create the SparkSession `regional` runs on.

    If a session is already active it is returned as is (the caller's settings win). `log_file`
    redirects the JVM's stdout/stderr to that file (a new session only).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    conf = SparkConf().setMaster(master).setAppName(app_name)
    for key, value in {**quiet_conf(verbose=verbose), **(extra or {})}.items():
        conf.set(key, str(value))
    if log_file is not None and SparkContext._active_spark_context is None:
        from pyspark.java_gateway import launch_gateway

        log = open(log_file, "ab")  # noqa: SIM115 - kept open for the JVM's lifetime
        gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
        sc = SparkContext(conf=conf, gateway=gateway)
        session = SparkSession(sc)
    else:
        session = SparkSession.builder.config(conf=conf).getOrCreate()
    if not verbose:
        session.sparkContext.setLogLevel("ERROR")
    return session
