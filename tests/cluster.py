"""A real Spark standalone cluster on loopback for tests: one master and one worker, started
with pyspark's own `bin/spark-class` (no separate Spark download), stopped at the end.

The master and worker are JVM daemons in their own process group; their logs, the worker's
work directory (executor logs) and their stdout/stderr go to `log_dir`. Start-up waits until
the master's JSON status (`http://127.0.0.1:<ui>/json/`) lists the worker as ALIVE.
The daemons get a minimal environment (no PYTHONPATH, no AWS credentials): whatever executors
need must come from the application's settings (`spark.executorEnv.*`), as on a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["StandaloneCluster", "standalone_cluster"]

#: Start-up of two JVMs on a loaded 2-core machine; failing earlier would only be flaky.
START_TIMEOUT_S = 180.0
_POLL_S = 0.2
#: Loopback needs no proxy, whatever HTTP_PROXY says.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    """pyspark's install directory, which holds `bin/spark-class` and `jars/`."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").is_file():
        raise RuntimeError(f"{home}/bin/spark-class not found: pyspark is not a full install")
    return home


class StandaloneCluster:
    """A running master + worker: `master_url` (spark://), `ui_url` (the master's web UI)."""

    def __init__(self, log_dir: Path, *, cores: int = 2, memory: str = "1g") -> None:
        self.log_dir = log_dir
        self.cores = cores
        self.memory = memory
        self.master_port = _free_port()
        self.master_ui_port = _free_port()
        self.worker_ui_port = _free_port()
        self.master_url = f"spark://127.0.0.1:{self.master_port}"
        self.ui_url = f"http://127.0.0.1:{self.master_ui_port}"
        self._procs: list[subprocess.Popen[bytes]] = []

    def _env(self) -> dict[str, str]:
        keep = ("PATH", "HOME", "JAVA_HOME", "LANG", "TMPDIR")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.log_dir),
            SPARK_WORKER_DIR=str(self.log_dir / "work"),
            SPARK_DAEMON_MEMORY="256m",
            # the daemons start as fast as the tests' drivers (`jvm_startup`), when set
            SPARK_DAEMON_JAVA_OPTS=os.environ.get("SPARK_SUBMIT_OPTS", ""),
        )
        return env

    def _spawn(self, name: str, *args: str) -> None:
        spark_class = str(spark_home() / "bin" / "spark-class")
        with open(self.log_dir / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(
                [spark_class, *args],
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends its children too
            )
        self._procs.append(proc)

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, apps)."""
        with _NO_PROXY.open(f"{self.ui_url}/json/", timeout=5) as r:
            return json.loads(r.read())

    def _await(self, what: str, ready: Callable[[dict[str, Any]], bool]) -> None:
        """Poll until `ready(status)` holds; fail with the daemons' log tails if a daemon
        exits or START_TIMEOUT_S passes."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{what}: a daemon exited ({proc.returncode})\n{self.logs()}"
                    )
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                if ready(self.status()):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{what}: not ready after {START_TIMEOUT_S:.0f} s\n{self.logs()}"
                )
            time.sleep(_POLL_S)

    def start(self) -> None:
        """Start the master, then the worker; return once the worker is ALIVE."""
        (self.log_dir / "work").mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.master_port)),
            *("--webui-port", str(self.master_ui_port)),
        )
        self._spawn(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--webui-port", str(self.worker_ui_port)),
            *("--cores", str(self.cores), "--memory", self.memory),
            *("--work-dir", str(self.log_dir / "work"), self.master_url),
        )
        self._await(
            "standalone worker",
            lambda s: any(w.get("state") == "ALIVE" for w in s.get("workers", [])),
        )

    def stop(self) -> None:
        """End the worker (and its executors), then the master: SIGTERM to each daemon's
        process group, SIGKILL after 30 s."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()

    def logs(self, lines: int = 30) -> str:
        """The last `lines` of each daemon's output, for failure messages."""
        out = []
        for name in ("master", "worker"):
            path = self.log_dir / f"{name}.out"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(out)


@contextlib.contextmanager
def standalone_cluster(log_dir: Path, **kwargs: Any) -> Iterator[StandaloneCluster]:
    """A started `StandaloneCluster`, stopped on exit (also when start-up fails)."""
    cluster = StandaloneCluster(log_dir, **kwargs)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
