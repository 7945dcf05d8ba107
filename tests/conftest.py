"""Fixtures shared by every test folder: locally built models (never downloaded), a real
S3-compatible server (moto) for the storage tests, and the real local stack (started once
per session for every test that asks for it)."""

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# Under pytest-xdist (``make test`` runs two workers) every worker is a process of its own:
# give each its own Prefect home, so that two ephemeral API servers never share one SQLite
# database. Set before anything imports prefect, which reads it once.
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    import tempfile

    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix=f"prefect-home-{worker}-")

import flows  # noqa: F401, E402  (first: its process settings, e.g. OMP_WAIT_POLICY, precede torch)

# Outage tests stop the store on purpose: give up after seconds, not the default minutes.
os.environ.setdefault("NEMO_RL_CORE_STORAGE_BUDGET_S", "8")
from prefect_harness import prefect_test_api  # noqa: E402
from python_forks import PythonForks  # noqa: E402

from nemo_rl_core.models.local_models import build_tiny_model

# The stack driver lives with the scripts it drives (infra/), shared with bench/soak.py.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "infra"))
from local_stack import LocalStack, running_stack  # noqa: E402
from moto_server import running_moto_server  # noqa: E402

# Fixtures made once per module or class (a flow run the module's tests all read): under
# ``--dist loadgroup`` the tests of one module would otherwise be spread over both workers,
# and each worker would make the fixture again.
SHARED_SCOPES = {"module", "class", "package"}


def xdist_group_of(item: pytest.Item) -> str | None:
    """The stack tests share one worker (the stack is a session fixture: one PostgreSQL,
    Prefect server and worker, not one per xdist worker); a module whose tests use a
    module-scoped fixture runs in one worker, which makes it once."""
    if "local_stack" in getattr(item, "fixturenames", ()):
        return "stack"
    fixture_info = getattr(item, "_fixtureinfo", None)
    definitions = fixture_info.name2fixturedefs.values() if fixture_info else ()
    if any(defs[-1].scope in SHARED_SCOPES for defs in definitions):
        return f"module-{item.path.relative_to(item.config.rootpath)}"
    return None


def start_order(item: pytest.Item) -> tuple[bool, bool, bool]:
    """The stack group first (the longest chain of tests on one worker), then the real-model
    tests, then the groups sharing a module fixture, then the rest: the long units start
    first and the short ones fill the end, so both workers finish close together."""
    group = item.get_closest_marker("xdist_group")
    return (
        group is None or group.args[0] != "stack",
        item.get_closest_marker("e2e") is None,
        group is None,
    )


@pytest.hookimpl(tryfirst=True)  # the groups must be marked before xdist reads them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for ``--dist loadgroup`` and the order they start in (Makefile: with
    ``--no-loadscope-reorder``, xdist hands them out in this order)."""
    for item in items:
        if group := xdist_group_of(item):
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=start_order)


@pytest.fixture(scope="session")
def python_forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PythonForks]:
    """Commands run as ``python -c`` runs them, each forked from one process that imported
    what the command line imports first (``flows.cli``, torch-free): tests/python_forks.py."""
    forks = PythonForks(tmp_path_factory.mktemp("forks"), ("flows.cli",), ROOT)
    yield forks
    forks.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Llama (tied embeddings, fp32) with a locally trained tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen2 (qkv bias, untied embeddings, fp32)."""
    return build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-qwen2", "qwen2", tie_word_embeddings=False
    )


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """Prefect's ephemeral API for this session (each xdist worker its own), shared by every
    folder that runs flows: Prefect sends the task-run events of a process to the first API it
    met (its events worker keeps that URL), so a second harness in the same process would get
    flow runs without their task runs. Its database starts as a copy of a migrated one
    (tests/prefect_harness.py).

    Without Prefect's flow-run heartbeats (its default sends one every 180 s, from a thread
    that sleeps in 1 s steps): a flow run's end waits for that thread, up to a second of a
    test's wall time per flow run, and the project reads no heartbeat. The flow runs of the
    stack's worker and of the benchmarks' own processes keep Prefect's default."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with (
        prefect_test_api(),
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        yield


@pytest.fixture(scope="session")
def nemo_rl_configs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NeMo RL v0.7.0's ``examples/configs`` (with its prompts beside), exported from the
    mirror; the test skips, saying so, where there is no mirror. Imported here, not at the
    top: its algorithm imports (torch, transformers) would cost xdist's controller, which
    loads this file and runs no test, seconds of CPU for nothing."""
    from nemo_rl_examples import MIRROR, export_examples

    if not MIRROR.exists():
        pytest.skip(f"no NeMo RL mirror at {MIRROR} (set NEMO_RL_MIRROR)")
    return export_examples(tmp_path_factory.mktemp("nemo_rl"))


@pytest.fixture(scope="session")
def local_stack() -> Iterator[LocalStack]:
    """PostgreSQL, Prefect server, process worker and moto S3 for this test session. Its
    scheduler looks for due schedules every 5 s, not 60: a test waiting for a schedule's
    runs waits seconds (tests/stack/test_training_on_stack.py)."""
    with running_stack(settings={"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5"}) as stack:
        yield stack


@pytest.fixture(scope="session")
def stack_deployments(local_stack: LocalStack) -> dict[str, str]:
    """prefect.yaml's deployments on the session's stack (deployed once): id by name."""
    return local_stack.deploy_all()


@dataclass(frozen=True)
class S3Server:
    """A running moto S3 server: where it listens and the fsspec options to reach it."""

    endpoint_url: str
    storage_options: dict


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3-compatible server (moto_server) on 127.0.0.1, with dummy credentials."""
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with running_moto_server(log, startup_limit_s=60) as endpoint:
        yield S3Server(
            endpoint_url=endpoint,
            storage_options={
                "endpoint_url": endpoint,
                "key": "testing",
                "secret": "testing",
                "client_kwargs": {"region_name": "us-east-1"},
            },
        )


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the test S3 server; returns its name."""
    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    options = s3_server.storage_options
    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["file", "s3"])
def storage_root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict | None]:
    """(root URL, storage_options) of an empty storage root, on local disk and on S3."""
    if request.param == "file":
        return f"file://{tmp_path / 'store'}", None
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/prefix", dict(server.storage_options)
