"""Storage faults on a real S3 server (moto behind a switchable proxy): an outage shorter
than the stage's retry window is survived by Prefect's retries; a lasting one fails the
stage with a StorageError naming the object, and the committed checkpoint stays intact."""

import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
from reliability_helpers import CONFIG
from switchable_proxy import SwitchableProxy

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.storage.handles import RunRef, open_storage, use_storage_options
from nemo_rl_core.storage.outage import BUDGET_ENV
from nemo_rl_core.storage.run_storage import StorageError
from tasks.stage import stage

# An outage shorter than a storage call's budget (8 s, tests/conftest.py): its tries come at
# 0, 1, 3 s (backoff 1, 2 s), the third after the store is back.
OUTAGE_S = 2.5


@pytest.fixture
def s3_run(s3_server, s3_bucket, tmp_path: Path):
    """A run on S3 reached through the proxy, with its config and a committed step 1."""
    proxy = SwitchableProxy(urlparse(s3_server.endpoint_url).port)
    root = f"s3://{s3_bucket}/outage"
    use_storage_options(
        root,
        {
            **s3_server.storage_options,
            "endpoint_url": proxy.endpoint_url,
            # one botocore attempt: the stage's own retries are what this test exercises
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
        },
    )
    run = RunRef(root, f"outage-{uuid.uuid4().hex[:6]}")
    storage = open_storage(run)
    storage.write_run_config(load_master_config(str(CONFIG)).model_dump(mode="json"))
    weights = tmp_path / "ckpt"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"committed weights")
    storage.write_checkpoint(1, weights, {"step": 1})
    yield run, proxy
    proxy.start()


def test_outage_within_retry_window_is_retried_and_the_stage_succeeds(prefect_api, s3_run) -> None:
    run, proxy = s3_run
    proxy.stop()
    threading.Timer(OUTAGE_S, proxy.start).start()
    started = time.monotonic()
    outputs = stage(run, 0, "prompts", {})
    assert proxy.refused > 0, "the stage never met the outage"
    assert time.monotonic() - started >= OUTAGE_S
    entry = open_storage(run).read_manifest(0).stages["prompts"]
    assert entry.complete and entry.outputs == outputs.outputs
    batch = open_storage(run).read_batch(outputs.outputs["batch"])
    assert batch.size == 4  # 2 prompts x 2 generations, read back whole


def test_lasting_outage_fails_with_storage_error_and_keeps_the_checkpoint(
    prefect_api, s3_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, proxy = s3_run
    monkeypatch.setenv(BUDGET_ENV, "2")  # the call gives up after 2 s, not 8: the same path
    proxy.stop()
    with pytest.raises(StorageError, match=rf"{run.storage_root}/runs/{run.run_id}/") as info:
        stage(run, 0, "prompts", {})
    assert "storage unreachable for" in str(info.value)  # within the budget, then no retry
    proxy.start()
    storage = open_storage(run)
    assert storage.read_manifest(0).stages == {}, "nothing was committed"
    assert storage.committed_checkpoints() == [1]
    fetched = storage.fetch_checkpoint(1, tmp_path / "fetched")
    assert (fetched / "model.safetensors").read_bytes() == b"committed weights"
