"""Fixtures of the reliability suite: one uninterrupted run that faulted runs are compared
with (the tests that run flows ask for the session's Prefect API, ``prefect_api`` of
tests/conftest.py; the others need none)."""

from pathlib import Path

import pytest
from reliability_helpers import CONFIG


@pytest.fixture(scope="session")
def clean_run(prefect_api, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run of the fast config: the weights every faulted run must match."""
    from flows.grpo import grpo

    root = tmp_path_factory.mktemp("clean")
    grpo(config_path=str(CONFIG), run_id="clean", storage_root=str(root))
    return root
