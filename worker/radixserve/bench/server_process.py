"""Run `radixserve serve` as a child process and wait until it is ready.

For the serving benchmark's `--launch-server` and for tests that drive a real server over
HTTP: the server runs in its own interpreter on a free port and is stopped with SIGTERM
(its drain path), SIGKILL only as a last resort.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

READY_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A `radixserve serve` (or `radixserve router`) child on 127.0.0.1; a context manager."""

    def __init__(
        self,
        serve_args: list[str],
        log_path: Path | None = None,
        *,
        subcommand: str = "serve",
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "radixserve.entrypoints.cli", subcommand]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *serve_args]
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.process.returncode}")
            with contextlib.suppress(OSError):
                if self.get("/ready", timeout=2.0)[0] == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the server was not ready within {timeout:.0f}s")

    def child_pids(self) -> list[int]:
        """Direct children of the server process (the scheduler, multiprocessing helpers)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        with contextlib.suppress(OSError):
            return [int(pid) for pid in children.read_text().split()]
        return []

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()  # the scheduler notices its parent is gone and exits
                self.process.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        return self.process.returncode

    def __enter__(self) -> ServerProcess:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
