"""Faster JVM start-up for the tests' Spark drivers: about 4 s less per JVM, of which the suite
starts dozens (`regional run` in a subprocess, killed and resumed; the quickstart).

Every driver JVM the tests start (the shared session's and each `regional run` subprocess's)
is launched by ``spark-submit``, which adds ``SPARK_SUBMIT_OPTS`` to its command line. The tests
set it, once, before the first Spark test, to:

* ``-XX:SharedArchiveFile=<archive>``: an application class-data-sharing archive of the
  classes a driver loads to run a job (Spark's, Scala's, Py4J's), dumped once per machine and
  Java, pyspark and Python install (the key of its file name) by a driver that ran a small job
  and exited (``-XX:ArchiveClassesAtExit``). Loading classes from it halves the context's
  start. The JVM checks the archive against its class path and ignores one that does not
  match, quietly (``-Xlog:cds=off``): a stale or broken archive costs only the time it saves.
* ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``: the client compiler only and the serial
  collector, for JVMs that live seconds to minutes on small data (the job's work is in Python
  workers).

Not for production: a long-running driver wants the optimising compiler. The archive lives in
the user's cache directory (``$XDG_CACHE_HOME/regional-tests/``, by default
``~/.cache/regional-tests/``), so a clean clone on the same machine dumps none (the dump costs
about 25 s); when it cannot be dumped (a JVM without dynamic archiving), the tests run
without it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

__all__ = ["prepare"]

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "regional-tests"
FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"

#: Run by a child Python: a driver as `regional run` starts one, a small job through the
#: Python workers, then the JVM told to exit, which writes the archive (a JVM ended by its
#: parent's exit writes none).
_DUMP = textwrap.dedent(
    """
    import sys
    from regional.runtime.session import spark_context

    sc = spark_context("local[2]", log_file=sys.argv[1])
    rdd = sc.parallelize(range(8), 2).map(lambda x: (x % 2, x)).reduceByKey(lambda a, b: a + b)
    assert sorted(rdd.collect()) == [(0, 12), (1, 16)]
    jvm = sc._jvm
    sc.stop()
    try:
        jvm.java.lang.System.exit(0)
    except Exception:  # the gateway went with the JVM: expected
        pass
    """
)


def _key() -> str:
    """What an archive depends on: the Java that runs it, pyspark's jars, this Python."""
    java = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=False, timeout=60
    ).stderr
    text = "\n".join([java, version("pyspark"), os.path.realpath(sys.prefix)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _archive() -> Path | None:
    """The archive for this machine, dumped when missing; None when it cannot be."""
    try:
        archive = CACHE / f"spark-{_key()}.jsa"
    except (OSError, subprocess.SubprocessError):
        return None
    if archive.is_file():
        return archive
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    env = {
        **os.environ,
        "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial} {QUIET_CDS} {FLAGS}",
        "PYTHONPATH": str(ROOT),
    }
    try:
        subprocess.run(
            [sys.executable, "-c", _DUMP, str(partial.with_suffix(".log"))],
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    partial.with_suffix(".log").unlink(missing_ok=True)
    if not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        return None
    partial.replace(archive)  # whole or not at all, for a test run going on beside this one
    return archive


def prepare() -> None:
    """Set ``SPARK_SUBMIT_OPTS`` for every driver JVM started from here on (see above)."""
    if "-XX:TieredStopAtLevel" in os.environ.get("SPARK_SUBMIT_OPTS", ""):
        return
    archive = _archive()
    options = f"-XX:SharedArchiveFile={archive} {QUIET_CDS} {FLAGS}" if archive else FLAGS
    os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {options}".strip()
