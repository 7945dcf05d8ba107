"""Fixtures of the reliability suite: a Prefect API for the tests that run flows (the
others need none), and one uninterrupted run that faulted runs are compared with."""

from pathlib import Path

import pytest
from prefect.testing.utilities import prefect_test_harness
from reliability_helpers import CONFIG


@pytest.fixture(scope="session")
def prefect_api():
    """Prefect's ephemeral API for this session; flow subprocesses are pointed at it too."""
    with prefect_test_harness(server_startup_timeout=600):
        yield


@pytest.fixture(scope="session")
def clean_run(prefect_api, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run of the fast config: the weights every faulted run must match."""
    from flows.grpo import grpo

    root = tmp_path_factory.mktemp("clean")
    grpo(config_path=str(CONFIG), run_id="clean", storage_root=str(root))
    return root
