"""Prefect's test harness (an API server on a throwaway SQLite database), started from a copy
of an empty database already migrated to this Prefect's schema: a new one costs its server
~5 s of migrations at every start, on every xdist worker. Nor does the server register the
block types of the installed collections at its start (importing prefect-aws and writing its
types: seconds more of CPU per worker): a test that saves a block registers its type, as
``Block.save`` does."""

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# Beside the locally built models (nemo_rl_core.models.local_models): kept across sessions.
TEMPLATES = Path.home() / ".cache" / "nemo_rl_core" / "prefect-test-db"
HARNESS_DATABASE = "prefect-test.db"  # the file prefect_test_harness puts in its folder


def migrated_database() -> Path:
    """An empty database at this Prefect's newest migration, made once per Prefect version
    by ``prefect server database upgrade`` (one process at a time: a lock beside it)."""
    import prefect

    template = TEMPLATES / f"prefect-{prefect.__version__}.db"
    if template.exists():
        return template
    TEMPLATES.mkdir(parents=True, exist_ok=True)
    with open(template.with_suffix(".lock"), "w") as lock:  # closing it unlocks
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            partial = template.with_suffix(f".partial.{os.getpid()}")
            url = f"sqlite+aiosqlite:///{partial}"
            subprocess.run(
                [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                env={**os.environ, "PREFECT_API_DATABASE_CONNECTION_URL": url},
                capture_output=True,
                check=True,
                timeout=600,
            )
            partial.rename(template)
    return template


@contextmanager
def prefect_test_api() -> Iterator[None]:
    """``prefect_test_harness``, its database a copy of :func:`migrated_database`."""
    from prefect.settings import (
        PREFECT_API_BLOCKS_REGISTER_ON_START,
        PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION,
        temporary_settings,
    )
    from prefect.testing import utilities

    template = migrated_database()
    # the server process takes the settings set here (the harness passes them on)
    no_block_registration = {
        PREFECT_API_BLOCKS_REGISTER_ON_START: False,
        PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION: False,  # else it imports the collections
    }

    def folder_with_database() -> str:
        folder = tempfile.mkdtemp()
        shutil.copy(template, Path(folder) / HARNESS_DATABASE)
        return folder

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utilities, "mkdtemp", folder_with_database)  # the harness's folder
        with (
            temporary_settings(updates=no_block_registration),
            utilities.prefect_test_harness(server_startup_timeout=600),
        ):
            yield
