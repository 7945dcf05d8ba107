"""Security: run ids and stage names are checked before they become storage keys, and
storage credentials (a Prefect block, or the environment) never reach logs, manifests,
stored configs, task parameters or artifacts."""

import json
import os
from pathlib import Path

import pytest
from reliability_helpers import CONFIG

from flows.grpo import grpo
from flows.listing import PAGE, every_entry
from flows.rerun_stage import rerun_stage
from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.run_storage import RunStorage

BAD_NAMES = ["../escape", "/etc/passwd", "a/b", "..", "a\\b", "run id", ""]


@pytest.mark.parametrize("name", BAD_NAMES[:-1])  # an empty run_id means "a new run"
def test_bad_run_id_is_refused_before_storage_is_touched(
    prefect_api, name: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="invalid run_id"):
        grpo(config_path=str(CONFIG), run_id=name, storage_root=str(tmp_path))
    assert list(tmp_path.rglob("*")) == []


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_stage_and_object_names_are_refused(name: str, tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path), "run-1")
    batch = BatchedDataDict(x=[1])
    with pytest.raises(ValueError, match="invalid stage"):
        storage.write_batch(0, name, batch)
    with pytest.raises(ValueError, match="invalid name"):
        storage.write_batch(0, "generate", batch, name=name)
    with pytest.raises(ValueError, match="invalid stage"):
        storage.record_stage(0, name, {}, {})
    assert list(tmp_path.rglob("*")) == []


def test_rerun_stage_refuses_unknown_stage(prefect_api, tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path), "run-1")
    storage.write_run_config(load_master_config(str(CONFIG)).model_dump(mode="json"))
    with pytest.raises(ValueError, match=r"stage '\.\./train' is not one of"):
        rerun_stage(run_id="run-1", iteration=0, stage="../train", storage_root=str(tmp_path))
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["config.yaml"]


@pytest.mark.e2e
def test_credentials_never_written_anywhere(
    prefect_api, s3_server, s3_bucket, tmp_path: Path, monkeypatch, caplog, capfd
) -> None:
    from prefect.client.orchestration import get_client
    from prefect_aws import AwsCredentials

    block_secret = "BLOCKSECRETk9Zx0aQ7pW3mT5vL1nR8"
    env_secret = "ENVSECRETj4Hs8dF2gK6lQ9wE3rT7yU"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", env_secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVKEYID0000")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    AwsCredentials(
        aws_access_key_id="AKIABLOCKKEYID00",
        aws_secret_access_key=block_secret,
        aws_client_parameters={"endpoint_url": s3_server.endpoint_url},
        region_name="us-east-1",
    ).save("reliability-creds", overwrite=True)
    root = f"s3://{s3_bucket}/secure"
    summary = grpo(
        config_path=str(CONFIG),
        overrides=["grpo.max_num_steps=1"],
        run_id="secure",
        storage_root=root,
        storage_block="reliability-creds",
    )
    assert summary["iterations"] == [0]

    written: list[str] = []
    storage = RunStorage(root, "secure", storage_options=s3_server.storage_options)
    for path in storage.fs.find(storage.objects.run_path):
        if not path.endswith((".safetensors", ".pt", ".bin")):
            written.append(storage.fs.cat_file(path).decode(errors="replace"))
    assert any("iter_000000" in text for text in written), "manifests were read"
    with get_client(sync_client=True) as client:  # every page: the server is shared
        for read in (client.read_logs, client.read_artifacts, client.read_task_runs):
            entries = every_entry(lambda offset, read=read: read(limit=PAGE, offset=offset))
            written += [json.dumps(entry.model_dump(mode="json")) for entry in entries]
        runs = every_entry(lambda offset: client.read_flow_runs(limit=PAGE, offset=offset))
        written += [json.dumps(run.parameters, default=str) for run in runs]
    captured = capfd.readouterr()
    written += [caplog.text, captured.out, captured.err]
    written += [p.read_text(errors="replace") for p in Path(os.getcwd(), "logs").rglob("*.jsonl")]
    for secret in (block_secret, env_secret):
        leaks = [text[:200] for text in written if secret in text]
        assert leaks == [], f"credential found in: {leaks}"
