"""End to end: the SFT flow on the embedded default (tiny Llama, built-in addition
conversations; no server, local storage)."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flows.config_check import check_run_config
from flows.rerun_stage import rerun_stage
from flows.sft import sft
from nemo_rl_core.data.datasets.local_files import DatasetRowError
from nemo_rl_core.pipeline.algorithms import SFT
from nemo_rl_core.pipeline.spec import declared
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "sft_tiny.yaml"
STEPS = 2
# Validation at the start and after step 2 (val_period 2): iteration 2 only validates.
OVERRIDES = [f"sft.max_num_steps={STEPS}", "sft.val_period=2"]


def manifest(root: Path, run_id: str, iteration: int) -> dict:
    return json.loads(
        (root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json").read_text()
    )


def final_weights(root: Path, run_id: str) -> dict:
    step_dir = root / "runs" / run_id / "checkpoints" / f"step_{STEPS:06d}"
    return load_file(step_dir / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equal(b[name]), name


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("sft")
    summary = sft(
        config_path=str(CONFIG), overrides=OVERRIDES, run_id="clean", storage_root=str(root)
    )
    return root, summary


def test_train_and_validation_loss_drop(uninterrupted):
    root, summary = uninterrupted
    assert summary["iterations"] == [0, 1, 2]
    assert set(manifest(root, "clean", 0)["stages"]) == set(SFT.stage_names)
    assert set(manifest(root, "clean", 2)["stages"]) == {"validate", "checkpoint"}
    first, second, last = summary["metrics"]
    assert second["train/loss"] < first["train/loss"]
    assert last["validate/val_loss"] < first["validate/val_loss"]
    info = json.loads(
        (
            root / "runs" / "clean" / "checkpoints" / f"step_{STEPS:06d}" / "training_info.json"
        ).read_text()
    )
    assert (
        info["val:val_loss"] == last["validate/val_loss"]
    )  # checkpointing.metric_name ranks by it


def test_failed_train_resumes_to_identical_weights(uninterrupted, tmp_path, monkeypatch):
    clean_root, _ = uninterrupted
    monkeypatch.setenv(FAULT_ENV, "train@1")
    with pytest.raises(Exception, match="fault injected into stage 'train' of iteration 1"):
        sft(
            config_path=str(CONFIG),
            overrides=OVERRIDES,
            run_id="faulty",
            storage_root=str(tmp_path),
        )
    before = manifest(tmp_path, "faulty", 1)["stages"]
    assert set(before) == {"batch"}
    monkeypatch.delenv(FAULT_ENV)
    sft(config_path=str(CONFIG), overrides=OVERRIDES, run_id="faulty", storage_root=str(tmp_path))
    after = manifest(tmp_path, "faulty", 1)["stages"]
    assert after["batch"]["finished_at"] == before["batch"]["finished_at"], "batch was recomputed"
    assert_same_weights(final_weights(clean_root, "clean"), final_weights(tmp_path, "faulty"))


def test_rerun_of_one_stage_is_bit_identical(uninterrupted):
    root, _ = uninterrupted
    original = manifest(root, "clean", 1)["stages"]
    before = final_weights(root, "clean")
    for stage in ("batch", "train"):
        outputs = rerun_stage(run_id="clean", iteration=1, stage=stage, storage_root=str(root))
        for name, ref in outputs.items():
            assert ref["sha256"] == original[stage]["outputs"][name]["sha256"], (stage, name)
    assert manifest(root, "clean", 1)["stages"]["checkpoint"]["status"] == "stale"
    sft(config_path=str(CONFIG), overrides=OVERRIDES, run_id="clean", storage_root=str(root))
    assert all(s["status"] == "complete" for s in manifest(root, "clean", 1)["stages"].values())
    assert_same_weights(before, final_weights(root, "clean"))


def test_bad_data_is_refused_before_any_work(tmp_path):
    missing = tmp_path / "absent.jsonl"
    with pytest.raises(FileNotFoundError, match=f"dataset path {missing} does not exist"):
        check_sft_config([f"++data.train.data_path={missing}", *_local()])
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1 + 1?", "answer": "2"}\n{"question": "2 + 2?"}\n')
    keys = ["++data.train.input_key=question", "++data.train.output_key=answer"]
    with pytest.raises(DatasetRowError, match=r"rows.jsonl: row 1 has no column 'answer'"):
        check_sft_config([f"++data.train.data_path={rows}", *_local(), *keys])
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(DatasetRowError, match=r"chat.jsonl: row 0: 'messages' has no assistant"):
        check_sft_config([f"++data.train.data_path={chat}", *_local()])


def check_sft_config(overrides: list[str]) -> None:
    check_run_config(SFT.config_class, str(CONFIG), overrides, declared(SFT, "data_setup"))


def _local() -> list[str]:
    return ["data.train.dataset_name=ResponseDataset", "data.train.num_samples=null"]
