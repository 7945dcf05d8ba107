"""TRL's own venv (bench/vs_trl.py's; `make bench-venvs` builds it by hand): the tests that
compare with TRL use it where it is built, and build it under CI, where they always run."""

import fcntl
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import vs_trl  # noqa: E402


def trl_venv_wanted() -> bool:
    """Under CI always (a fresh clone: the fixture builds it); elsewhere where it is built."""
    return bool(os.environ.get("CI")) or (vs_trl.TRL_VENV / "bin" / "python").exists()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that ask for TRL's venv run in one xdist worker: under CI its build takes
    minutes, and a second worker waiting on it would stand idle instead of running others."""
    for item in items:
        if "trl_python" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("trl"))


@pytest.fixture(scope="session")
def trl_python() -> Path | None:
    """The TRL venv's python, built (or repaired) where wanted; None where it is not built.
    A lock beside the venv has a second process (another session, a second worker under
    another ``--dist``) wait for the first's build instead of installing into it at once."""
    if not trl_venv_wanted():
        return None
    vs_trl.TRL_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(vs_trl.TRL_VENV.with_name("trl.lock"), "w") as lock:  # closing it unlocks
        fcntl.flock(lock, fcntl.LOCK_EX)
        return vs_trl.ensure_trl_venv()


@pytest.fixture(autouse=True)
def flows_on_the_session_api(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A benchmark started here runs its flows on this worker's Prefect API (the session's,
    tests/conftest.py) instead of starting a temporary server of its own, ~5 s of start-up
    per script. The stack's tests keep the stack's API."""
    if request.node.get_closest_marker("stack") is not None:
        return
    request.getfixturevalue("prefect_api")
    from prefect.settings import get_current_settings

    monkeypatch.setenv("PREFECT_API_URL", str(get_current_settings().api.url))
