"""Bad input is refused with one clear error naming the key, path or row, before any work:
the flow writes nothing under the storage root (no config, no lease, no stage output)."""

import json
from pathlib import Path

import pytest
from reliability_helpers import CONFIG

from flows.grpo import grpo
from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.storage.run_storage import RunStorage


def _bad_rows(tmp_path: Path) -> Path:
    path = tmp_path / "problems.jsonl"
    rows = [{"input": "1+1?", "output": "2"}, {"input": "2+2?"}]  # row 1: no answer
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("grpo.num_prompts_per_step=0", r"grpo\.num_prompts_per_step"),
        ("grpo.max_env_failure_fraction=2", r"grpo\.max_env_failure_fraction"),
        ("policy.train_micro_batch_size=abc", r"policy\.train_micro_batch_size"),
        ("grpo.num_prompts_per_stepp=2", r"grpo\.num_prompts_per_stepp"),
        ("++env.should_use_nemo_gym=true", r"env\.should_use_nemo_gym: NeMo Gym"),
        ("policy.model_name=/nonexistent/model-dir", r"/nonexistent/model-dir"),
        (
            "data.dataset_name=ResponseDataset BAD_ROWS",
            r"problems\.jsonl: row 1 has no column .output.",
        ),
    ],
    ids=[
        "bad-value",
        "out-of-range",
        "wrong-type",
        "unknown-key",
        "nemo-gym",
        "missing-model",
        "bad-row",
    ],
)
def test_bad_input_fails_before_any_work(
    prefect_api, override: str, message: str, tmp_path: Path
) -> None:
    if override.endswith("BAD_ROWS"):
        overrides = [
            "data.train.dataset_name=ResponseDataset",
            f"+data.train.data_path={_bad_rows(tmp_path)}",
        ]
    else:
        overrides = [override]
    root = tmp_path / "store"
    with pytest.raises(Exception, match=message):
        grpo(
            config_path=str(CONFIG),
            overrides=overrides,
            run_id="bad-input",
            storage_root=str(root),
        )
    assert not root.exists() or list(root.rglob("*")) == [], "work was done before the error"


@pytest.mark.parametrize(
    ("changed", "key"),
    [
        ("data.train.dataset_name=countdown", "data"),
        ("policy.model_name=tiny-qwen2", "policy.model_name"),
    ],
)
def test_resume_with_other_data_or_model_is_refused(
    prefect_api, changed: str, key: str, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    original = RunStorage(str(root), "resumed")
    original.write_run_config(load_master_config(str(CONFIG)).model_dump(mode="json"))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with pytest.raises(Exception, match=rf"run 'resumed' was started with a different {key}"):
        grpo(
            config_path=str(CONFIG),
            overrides=[changed],
            run_id="resumed",
            storage_root=str(root),
        )
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
