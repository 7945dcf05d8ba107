"""The toy pipeline registered while its tests run, Prefect's ephemeral API, its initial
model, and a fresh storage root per test. Each module's tests run in one xdist worker
(tests/conftest.py groups every module with a module-scoped fixture): its module-scoped runs
(the uninterrupted run that others are compared with) are made once."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from toy_pipeline import TOY, write_initial_model
from toy_runs import ToyRuns

from nemo_rl_core.pipeline.spec import registered_for


@pytest.fixture(scope="session", autouse=True)
def toy_flows_api(prefect_api: None) -> None:
    """The toy flows run on the session's API (tests/conftest.py)."""


@pytest.fixture(scope="module", autouse=True)
def toy_registered() -> Iterator[None]:
    """Registered per module: the registry outside these tests holds the real algorithms."""
    with registered_for(TOY):
        yield


@pytest.fixture(scope="module", autouse=True)
def no_curves() -> Iterator[None]:
    """The toy runs end without drawing their curves: the PNG (~0.7 s of matplotlib's CPU
    at the end of every flow run, a third of a toy run's) is no orchestration rule and
    nothing here reads it. tests/flows/test_report.py draws curves, and the GRPO flows of
    tests/reliability end by drawing theirs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("flows.progress.plot_curves", lambda run_id, summaries, path: path)
        yield


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_initial_model(tmp_path_factory.mktemp("toy-model"))


@pytest.fixture
def toy(tmp_path: Path, toy_model: Path) -> ToyRuns:
    return ToyRuns(tmp_path, toy_model)
