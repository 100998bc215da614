"""A real S3-compatible server for tests: moto's server mode in a subprocess.

``python -m moto.server`` listens on a free loopback port and keeps every
bucket in its memory; it dies with the test process (parent-death signal).
It implements conditional PUTs (``If-None-Match: *``), ranged GETs and
paginated listing, which is what the tier-2 S3 driver uses.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from quire.sandbox import free_port, parent_death_prefix

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "quire-test", "AWS_SECRET_ACCESS_KEY": "quire-test"}
"""moto accepts any credentials; the driver still signs with these."""


class S3ServerUnavailable(RuntimeError):
    """The moto server did not start; the message carries its log."""


@dataclass(frozen=True)
class S3Endpoint:
    """A running server and a bucket created in it."""

    endpoint_url: str
    bucket: str
    region: str = REGION

    def uri(self, prefix: str, **options: str) -> str:
        """An ``s3://`` tier-2 URI for ``prefix`` in the bucket."""
        query = "&".join(f"{k}={v}" for k, v in
                         {"endpoint_url": self.endpoint_url, "region": self.region,
                          **options}.items())
        return f"s3://{self.bucket}/{prefix}?{query}"


class MotoS3Server:
    """``start()``, then :attr:`endpoint_url`; ``stop()``."""

    def __init__(self, start_timeout_s: float = 30.0, host: str = "127.0.0.1", port: int = 0,
                 command_prefix: Sequence[str] = ()) -> None:
        """``host``/``port``: where it listens (0: a free loopback port);
        ``command_prefix``: run it through that (``ip netns exec NS``)."""
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self.host = host
        self.port = port
        self._command_prefix = list(command_prefix)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self.port = self.port or free_port()
        self._log_path = Path(tempfile.mkstemp(prefix="quire-moto-", suffix=".log")[1])
        with open(self._log_path, "wb") as log:
            self._process = subprocess.Popen(  # (SIGKILL when the test process dies)
                [*self._command_prefix, *parent_death_prefix(signal.SIGKILL), sys.executable,
                 "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise

    def _wait_until_serving(self) -> None:
        """Poll with an HTTP request until the server answers (any status)."""
        deadline = time.monotonic() + self._start_timeout_s
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise S3ServerUnavailable(
                    f"moto exited with status {self._process.returncode}:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(self.endpoint_url + "/", timeout=1).close()
                return
            except urllib.error.HTTPError:
                return  # an answer: it serves
            except OSError:
                if time.monotonic() > deadline:
                    raise S3ServerUnavailable(
                        f"moto did not serve within {self._start_timeout_s} s:\n"
                        f"{self.log_tail()}") from None
            time.sleep(0.02)  # poll interval

    def create_bucket(self, bucket: str) -> S3Endpoint:
        import boto3  # moto's dependency; only the fixture needs it

        client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=REGION,
                              aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        client.create_bucket(Bucket=bucket)
        client.close()
        return S3Endpoint(self.endpoint_url, bucket)

    def log_tail(self, lines: int = 20) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    def send_signal(self, sig: int) -> None:
        """Signal the server process (SIGSTOP: it hangs; SIGCONT: it goes on)."""
        assert self._process is not None
        self._process.send_signal(sig)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
            self._process = None
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

