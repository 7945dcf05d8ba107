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
from nemo_rl_examples import MIRROR, export_examples  # noqa: E402

from nemo_rl_core.models.local_models import build_tiny_model

# The stack driver lives with the scripts it drives (infra/), shared with bench/soak.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infra"))
from local_stack import LocalStack, running_stack  # noqa: E402
from moto_server import running_moto_server  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test on the local stack runs in one xdist worker (``--dist loadgroup``): the
    stack is a session fixture, so the stack tests share one PostgreSQL, Prefect server and
    worker instead of starting one per xdist worker."""
    for item in items:
        if "local_stack" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("stack"))


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
def nemo_rl_configs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NeMo RL v0.7.0's ``examples/configs`` (with its prompts beside), exported from the
    mirror; the test skips, saying so, where there is no mirror."""
    if not MIRROR.exists():
        pytest.skip(f"no NeMo RL mirror at {MIRROR} (set NEMO_RL_MIRROR)")
    return export_examples(tmp_path_factory.mktemp("nemo_rl"))


@pytest.fixture(scope="session")
def local_stack() -> Iterator[LocalStack]:
    """PostgreSQL, Prefect server, process worker and moto S3 for this test session."""
    with running_stack() as stack:
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
