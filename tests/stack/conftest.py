"""The ``local_stack`` fixture: the real local stack for one test session."""

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_stack import LocalStack, start_stack, stop_stack


@pytest.fixture(scope="session")
def local_stack() -> Iterator[LocalStack]:
    """Start the stack once per session; stop it at the end even on failure."""
    # Not under pytest's tmp dir: that one is private to its owner, and PostgreSQL
    # runs as the `postgres` OS user when the tests run as root.
    state_dir = Path(tempfile.mkdtemp(prefix="nemo-rl-stack-"))
    state_dir.chmod(0o755)
    try:
        started = time.monotonic()
        stack, output = start_stack(state_dir)
        print(f"\nlocal stack up in {time.monotonic() - started:.1f} s:\n{output}")
        yield stack
    finally:
        stop_stack(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
