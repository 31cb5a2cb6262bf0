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
import re
import sys
from importlib import resources
from typing import TYPE_CHECKING, Any

from regional.errors import RegionalError

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_MASTER",
    "SparkStartError",
    "quiet_conf",
    "spark_context",
    "spark_session",
    "start_failure",
]

DEFAULT_MASTER = "local[*]"


class SparkStartError(RegionalError):
    """Spark did not start with the given master URL and settings (a bad `--master` or
    `--conf`): bad input, exit code 2. The message names the master and Spark's reason."""

    exit_code = 2


#: A Java exception class in front of its message: `org.apache.spark.SparkException: `.
_JAVA_CLASS = re.compile(r"^(?:[\w$]+\.)+[\w$]*(?:Exception|Error): ")


def start_failure(output: str) -> str | None:
    """Spark's reason for not starting, from the JVM's output or a Py4J error's text: its first
    line that is not a warning, a stack frame or Py4J's preamble, without the Java class name.

    >>> start_failure('WARNING: Using incubator modules\\nInvalid maximum heap size: -Xmxabc\\n'
    ...               'Error: Could not create the Java Virtual Machine.')
    'Invalid maximum heap size: -Xmxabc'
    >>> start_failure('Exception in thread "main" org.apache.spark.SparkException: Master must '
    ...               'either be yarn or start with spark, k8s, or local\\n\\tat org.apache...')
    'Master must either be yarn or start with spark, k8s, or local'
    """
    for raw in output.splitlines():
        line = raw.strip().removeprefix(": ")
        if not line or line.startswith(("WARNING", "at ", "...", "An error occurred while")):
            continue
        line = re.sub(r'^Exception in thread "[^"]*" ', "", line)
        return _JAVA_CLASS.sub("", line)
    return None


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


def spark_context(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "regional",
    verbose: bool = False,
    log_file: str | None = None,
    extra: dict[str, Any] | None = None,
) -> SparkContext:
    """Get or create the SparkContext `regional` runs on, without a SparkSession: pipelines
    only submit jobs, and a session's SQL state costs seconds at start (`regional run` uses
    this). If a context is already active it is returned as is (the caller's settings win).
    `log_file` redirects the JVM's stdout/stderr to that file (a new context only)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkException

    active = SparkContext._active_spark_context
    if active is not None:
        return active
    conf = SparkConf().setMaster(master).setAppName(app_name)
    for key, value in {**quiet_conf(verbose=verbose), **(extra or {})}.items():
        conf.set(key, str(value))
    log_start = 0
    try:
        gateway = None
        if log_file is not None:
            from pyspark.java_gateway import launch_gateway

            log = open(log_file, "ab")  # noqa: SIM115 - kept open for the JVM's lifetime
            log_start = log.tell()
            gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
        sc = SparkContext(conf=conf, gateway=gateway)
    except (PySparkException, Py4JError) as exc:  # the JVM exited, or the context refused
        # A Py4J error carries the Java exception; a JVM that exited left its reason in the log.
        reason_in_log = log_file is not None and not isinstance(exc, Py4JError)
        raise _start_error(master, exc, log_file, log_start if reason_in_log else None) from exc
    if not verbose:
        sc.setLogLevel("ERROR")
    return sc


def spark_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "regional",
    verbose: bool = False,
    log_file: str | None = None,
    extra: dict[str, Any] | None = None,
) -> SparkSession:
    """Get or create the SparkSession `regional` runs on (`spark_context`'s context, with a
    session over it for the caller's own DataFrames).

    If a session is already active it is returned as is (the caller's settings win). `log_file`
    redirects the JVM's stdout/stderr to that file (a new session only).
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    sc = spark_context(master, app_name=app_name, verbose=verbose, log_file=log_file, extra=extra)
    return SparkSession(sc)


def _start_error(
    master: str, exc: Exception, log_file: str | None, log_start: int | None
) -> SparkStartError:
    """One line for a Spark that did not start: Spark's reason, from the JVM's output in
    `log_file` from offset `log_start` when given, else from the error."""
    output = str(exc)
    if log_file is not None and log_start is not None:
        with open(log_file, "rb") as log:
            log.seek(log_start)
            output = log.read().decode(errors="replace")
    reason = start_failure(output) or type(exc).__name__
    where = f"Spark's output is in {log_file}" if log_file else "see Spark's output above"
    return SparkStartError(
        f"Spark did not start (master {master!r}): {reason}; check the master URL (--master) "
        f"and the Spark settings (--conf); {where}"
    )
