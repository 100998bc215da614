"""A Spark standalone cluster of real processes, from the pip ``pyspark`` package.

:class:`SparkStandalone` starts a master and ``workers`` workers, each its
own JVM started through ``$SPARK_HOME/bin/spark-class`` (classes
``org.apache.spark.deploy.master.Master`` and
``org.apache.spark.deploy.worker.Worker``), bound to 127.0.0.1, with its own
process group; executors (and their Python workers) are children of a
worker, so stopping the worker's group stops them too.  Readiness is the
master's ``/json/`` page listing every worker ALIVE (polled with a deadline,
never slept for).

What the pip package needs that a Spark distribution would not (the traps):

- ``SPARK_HOME`` is the ``pyspark`` package directory (its ``bin`` and
  ``jars``);
- a worker needs ``--work-dir`` (else it writes under ``SPARK_HOME``);
- executors run Python workers with the driver's ``PYSPARK_PYTHON`` (set
  it to this interpreter, the venv's) and the worker's ``PYTHONPATH`` (the
  tree's ``src`` and root first, so the tree's :mod:`quire` wins over an
  installed one);
- ``SPARK_LOCAL_IP=127.0.0.1`` and ``SPARK_LOCAL_DIRS`` under the cluster's
  directory.

One Python process holds one SparkContext, so a test process that already
has a ``local[2]`` session drives the cluster from a child process:
:meth:`SparkStandalone.run_driver` runs a Python driver script with the
cluster's master URL in ``QUIRE_SPARK_MASTER``; the script builds its
session with :func:`cluster_session`.  Scripts and benchmarks start a
cluster with ``python -m tests.support.spark_cluster`` (prints one JSON
line ``{"master": "spark://...", "ui": "http://..."}``, serves until stdin
closes or SIGTERM) or use :class:`SparkStandalone` as a context manager.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from quire.sandbox import free_port

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]

MASTER_ENV = "QUIRE_SPARK_MASTER"
"""The master URL a driver script started by :meth:`SparkStandalone.run_driver` reads."""

CLUSTER_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "768m",
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.task.maxFailures": "2",
    "spark.python.worker.reuse": "true",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "200",
    "spark.sql.streaming.stopTimeout": "30s",
}
"""A driver's settings on the cluster: one 1-core executor per worker."""


def spark_home() -> Path:
    """The pip ``pyspark`` package directory (it holds ``bin/spark-class`` and ``jars``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_env(root: Path) -> dict[str, str]:
    """The environment of the cluster's processes and of drivers started for it."""
    python_path = os.pathsep.join([str(REPO / "src"), str(REPO)]
                                  + ([os.environ["PYTHONPATH"]]
                                     if os.environ.get("PYTHONPATH") else []))
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(root / "local"),
        "SPARK_LOG_DIR": str(root / "logs"),
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_NO_DAEMONIZE": "1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": python_path,
    }


class SparkStandalone:
    """A master and ``workers`` workers (``cores`` cores, ``memory`` each) under ``root``."""

    def __init__(self, root: Path, workers: int = 2, cores: int = 1,
                 memory: str = "1g") -> None:
        self.root = root
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.ui_url = f"http://127.0.0.1:{self.ui_port}"
        self.env = spark_env(root)
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    # --- lifecycle -------------------------------------------------------------------

    def _spawn(self, name: str, *args: str) -> None:
        log = (self.root / "logs" / f"{name}.out").open("wb")
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args], cwd=self.root,
            env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)  # its own process group: executors die with it
        log.close()
        self._procs.append((name, proc))

    def start(self, timeout_s: float = 120.0) -> SparkStandalone:
        """Start the master, then the workers; return once all are ALIVE."""
        for sub in ("local", "logs", "work"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master",
                        "--host", "127.0.0.1", "--port", str(self.port),
                        "--webui-port", str(self.ui_port))
            for i in range(self.workers):
                work = self.root / "work" / f"worker-{i}"
                work.mkdir(parents=True, exist_ok=True)
                self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker",
                            "--host", "127.0.0.1", "--webui-port", str(free_port()),
                            "--cores", str(self.cores), "--memory", self.memory,
                            "--work-dir", str(work), self.master_url)
            self._wait_alive(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def status(self) -> dict[str, Any] | None:
        """The master's ``/json/`` page, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=2) as answer:
                status: dict[str, Any] = json.load(answer)
                return status
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def alive_workers(self) -> int:
        status = self.status()
        if status is None:
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def _wait_alive(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while self.alive_workers() < self.workers:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"spark {name} exited with {proc.returncode}:\n"
                                       f"{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"spark standalone: {self.alive_workers()} of "
                                   f"{self.workers} workers alive after {timeout_s} s:\n"
                                   f"{self.log_tail('master')}")
            time.sleep(delay)  # polling interval of the readiness condition above
            delay = min(delay * 2, 0.5)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / "logs" / f"{name}.out"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def close(self, timeout_s: float = 20.0) -> None:
        """Stop every process group (workers first: their executors with them)."""
        for _, proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for _, proc in reversed(self._procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            # the group may outlive its leader (an executor, a Python worker)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self._procs.clear()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- drivers ---------------------------------------------------------------------

    def run_driver(self, script: Path, *args: str, timeout_s: float = 240.0,
                   env: dict[str, str] | None = None,
                   check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``python script args`` as a driver of this cluster (its master
        URL in ``$QUIRE_SPARK_MASTER``), in its own process group (killed
        whole on timeout); its output."""
        proc = subprocess.Popen(
            [sys.executable, str(script), *args], cwd=REPO, text=True,
            env={**self.env, MASTER_ENV: self.master_url, **(env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its JVM, if it outlived it
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and done.returncode != 0:
            raise AssertionError(f"driver {script.name} exited with {done.returncode}:\n"
                                 f"{err[-4000:]}")
        return done


def cluster_session(app_name: str, master: str | None = None,
                    conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession on the standalone master ``master`` (default
    ``$QUIRE_SPARK_MASTER``) with :data:`CLUSTER_CONF` (and ``conf``)."""
    from pyspark.sql import SparkSession

    url = master or os.environ[MASTER_ENV]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(url).appName(app_name)
    for key, value in {**CLUSTER_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    """``python -m tests.support.spark_cluster [DIR] [--workers N]
    [--until-signal]``: start a cluster, print its URLs as one JSON line,
    serve until stdin closes (with --until-signal: until SIGTERM or SIGINT),
    then stop it."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("dir", nargs="?", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--until-signal", action="store_true",
                        help="serve until SIGTERM/SIGINT, not until stdin closes")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="quire-spark-"))
    cluster = SparkStandalone(root, workers=args.workers)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with cluster:
        print(json.dumps({"master": cluster.master_url, "ui": cluster.ui_url,
                          "dir": str(root), "workers": args.workers}), flush=True)
        if args.until_signal:
            while True:
                signal.pause()
        else:
            sys.stdin.read()


if __name__ == "__main__":
    main()
