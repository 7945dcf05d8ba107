"""TRL's own venv (bench/vs_trl.py's; `make bench-venvs` builds it by hand): the tests that
compare with TRL use it where it is built, and build it under CI, where they always run."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import vs_trl  # noqa: E402


@pytest.fixture(scope="session")
def trl_python() -> Path | None:
    """The TRL venv's python, built if missing under CI; None where it is not built."""
    if os.environ.get("CI") or (vs_trl.TRL_VENV / "bin" / "python").exists():
        return vs_trl.ensure_trl_venv()
    return None
