"""A throwaway S3-compatible server (moto_server) on 127.0.0.1, for tests and benchmarks that
need real S3 calls without the whole local stack."""

import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def moto_executable() -> Path:
    """The venv's moto_server next to this interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / "moto_server"
    return beside if beside.exists() else Path(shutil.which("moto_server") or beside)


@contextmanager
def running_moto_server(log_path: Path, startup_limit_s: float = 120.0) -> Iterator[str]:
    """Start moto_server on a free port, yield its endpoint URL once it answers, stop it on
    exit; a server that dies or stays silent raises with the log's path."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(moto_executable()), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_up(endpoint, proc, startup_limit_s, log_path)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_until_up(endpoint: str, proc: subprocess.Popen, limit_s: float, log: Path) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            return
        except urllib.error.HTTPError:  # answering at all means it is up
            return
        except OSError as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"moto_server did not start on {endpoint}: {exc}; see {log}"
                ) from exc
            time.sleep(0.1)
