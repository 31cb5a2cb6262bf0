"""Faster JVM start-up for the tests' Spark drivers: about 4 s less per JVM, of which the suite
starts dozens (`regional run` in a subprocess, killed and resumed; the quickstart).

Every driver JVM the tests start (the shared session's and each `regional run` subprocess's)
is launched by ``spark-submit``, which adds ``SPARK_SUBMIT_OPTS`` to its command line. The tests
set it before the first test, when any needs Spark (and again once the archive is there), to:

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
``~/.cache/regional-tests/``), so a clean clone on the same machine dumps none. Where there is
none yet, it is dumped in the background (about 25 s) while the first tests run without it;
when it cannot be dumped (a JVM without dynamic archiving), the tests run without it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from importlib.metadata import version
from pathlib import Path

__all__ = ["prepare", "refresh"]

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "regional-tests"
FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"

#: Run by a child Python (argv: log, partial, archive): a driver as `regional run` starts one,
#: a small job through the Python workers, then the JVM told to exit, which writes the archive
#: (a JVM ended by its parent's exit writes none); once the JVM has ended, the archive is moved
#: into place, whole or not at all. The child does it, so an archive still being written when
#: the test run ends lands all the same.
_DUMP = textwrap.dedent(
    """
    import os, sys
    from regional.runtime.session import spark_context

    log, partial, archive = sys.argv[1:4]
    sc = spark_context("local[2]", log_file=log)
    rdd = sc.parallelize(range(8), 2).map(lambda x: (x % 2, x)).reduceByKey(lambda a, b: a + b)
    assert sorted(rdd.collect()) == [(0, 12), (1, 16)]
    jvm, launched = sc._jvm, sc._gateway.proc
    sc.stop()
    try:
        jvm.java.lang.System.exit(0)
    except Exception:  # the gateway went with the JVM: expected
        pass
    launched.wait(timeout=240)
    if os.path.exists(log):
        os.unlink(log)
    if os.path.isfile(partial) and os.path.getsize(partial) > 0:
        os.replace(partial, archive)
    elif os.path.exists(partial):
        os.unlink(partial)
    """
)


def _key() -> str:
    """What an archive depends on: the Java that runs it, pyspark's jars, this Python."""
    java = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=False, timeout=60
    ).stderr
    text = "\n".join([java, version("pyspark"), os.path.realpath(sys.prefix)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Dump:
    """The archive being dumped by a child Python (`_DUMP`) while the tests go on: it costs
    about 25 s of a fresh machine's first run."""

    def __init__(self, archive: Path) -> None:
        CACHE.mkdir(parents=True, exist_ok=True)
        self.archive = archive
        partial = archive.with_suffix(f".{os.getpid()}.partial")
        env = {
            **os.environ,
            "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial} {QUIET_CDS} {FLAGS}",
            "PYTHONPATH": str(ROOT),
        }
        args = [str(partial.with_suffix(".log")), str(partial), str(archive)]
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _DUMP, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not stopped by a Ctrl-C meant for the tests
        )

    def ended(self) -> bool:
        """Whether the dump has ended (given up after `DUMP_TIMEOUT_S`)."""
        if self.process.poll() is None and time.monotonic() - self.started > DUMP_TIMEOUT_S:
            os.killpg(self.process.pid, signal.SIGKILL)  # its JVM too
            self.process.wait()
        return self.process.poll() is not None


#: A dump that has not ended after this long is given up (the tests go on without).
DUMP_TIMEOUT_S = 300.0
_pending: _Dump | None = None


def _use(archive: Path | None) -> None:
    options = f"-XX:SharedArchiveFile={archive} {QUIET_CDS} {FLAGS}" if archive else FLAGS
    base = os.environ.get("SPARK_SUBMIT_OPTS", "").replace(FLAGS, "").strip()
    os.environ["SPARK_SUBMIT_OPTS"] = f"{base} {options}".strip()


def prepare() -> None:
    """Set ``SPARK_SUBMIT_OPTS`` for every driver JVM started from here on (see above): with
    the archive when there is one; else without it, and its dump started in the background
    (`refresh` takes it up once it is there)."""
    global _pending
    if "-XX:TieredStopAtLevel" in os.environ.get("SPARK_SUBMIT_OPTS", ""):
        return
    try:
        archive = CACHE / f"spark-{_key()}.jsa"
    except (OSError, subprocess.SubprocessError):
        _use(None)
        return
    if archive.is_file():
        _use(archive)
        return
    _use(None)
    _pending = _Dump(archive)


def refresh() -> None:
    """Take up the archive once its background dump has ended (called before each test)."""
    global _pending
    if _pending is None:
        return
    if _pending.ended():
        if _pending.archive.is_file():
            _use(_pending.archive)
        _pending = None
