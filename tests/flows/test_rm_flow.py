"""End to end: the reward-model flow on the embedded default (tiny Llama with a scalar
head, built-in addition preference pairs; no server, local storage), and the chain a user
runs next: GRPO rewarded by the trained checkpoint through the reward_model environment."""

import shutil
from pathlib import Path

import pytest
import torch
from flow_testing import assert_bit_identical, checkpoint_dir, stages_of
from transformers import AutoModelForSequenceClassification

from flows.grpo import grpo
from flows.rerun_stage import rerun_stage
from flows.rm import rm
from nemo_rl_core.data.datasets.generators import addition_preferences
from nemo_rl_core.environments.reward_model_environment import RewardModelEnvironment
from nemo_rl_core.pipeline.algorithms import RM
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.run_storage import ObjectRef
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
CONFIG = CONFIGS / "rm_tiny.yaml"
STEPS = 8
# Validation at the start and after step 8; every checkpoint stays, for the rerun of step 1.
OVERRIDES = [f"rm.max_num_steps={STEPS}", "rm.val_period=8", "checkpointing.keep_top_k=null"]
VAL = "validate/validation-default_"


def checkpoint(root: Path, run_id: str) -> Path:
    return checkpoint_dir(root, run_id, STEPS)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("rm")
    summary = rm(
        config_path=str(CONFIG), overrides=OVERRIDES, run_id="clean", storage_root=str(root)
    )
    return root, summary


def test_reward_model_learns_to_rank_the_right_sum_first(first_run):
    root, summary = first_run
    assert summary["iterations"] == list(range(STEPS + 1))
    assert set(stages_of(root, "clean", 0)) == set(RM.stage_names)
    start, end = summary["metrics"][0], summary["metrics"][STEPS]
    # the scalar head starts at zero: every pair is tied
    assert start[f"{VAL}accuracy"] == 0.0
    assert start[f"{VAL}loss"] == pytest.approx(0.6931, abs=1e-4)
    assert end[f"{VAL}accuracy"] >= 0.6
    assert end[f"{VAL}rewards_chosen_mean"] > end[f"{VAL}rewards_rejected_mean"]
    assert end[f"{VAL}loss"] < start[f"{VAL}loss"]


def test_checkpoint_is_a_sequence_classifier_the_environment_scores_with(first_run):
    root, _ = first_run
    path = checkpoint(root, "clean")
    model = AutoModelForSequenceClassification.from_pretrained(path)
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None
    env = RewardModelEnvironment({"model_name": str(path)})
    chosen, rejected = [], []
    for row in addition_preferences(32, seed=7, held_out=True):
        better, worse = sorted(row["completions"], key=lambda c: c["rank"])
        chosen.append(row["context"] + better["completion"])
        rejected.append(row["context"] + worse["completion"])
    assert (env.score(chosen) > env.score(rejected)).float().mean() >= 0.6


def test_failed_train_resumes_to_identical_weights(first_run, tmp_path, monkeypatch):
    clean_root, _ = first_run
    monkeypatch.setenv(FAULT_ENV, "train@1")
    with pytest.raises(Exception, match="fault injected into stage 'train' of iteration 1"):
        rm(config_path=str(CONFIG), overrides=OVERRIDES, run_id="cut", storage_root=str(tmp_path))
    stored = stages_of(tmp_path, "cut", 1)
    assert set(stored) == {"batch"}
    monkeypatch.delenv(FAULT_ENV)
    rm(config_path=str(CONFIG), overrides=OVERRIDES, run_id="cut", storage_root=str(tmp_path))
    assert stages_of(tmp_path, "cut", 1)["batch"]["finished_at"] == stored["batch"]["finished_at"]
    assert_bit_identical(checkpoint(clean_root, "clean"), checkpoint(tmp_path, "cut"))


def test_rerun_of_train_is_bit_identical(first_run, tmp_path):
    root, _ = first_run
    recorded = stages_of(root, "clean", 1)
    before = Path(shutil.copytree(checkpoint(root, "clean"), tmp_path / "before"))
    outputs = rerun_stage(run_id="clean", iteration=1, stage="train", storage_root=str(root))
    for name, ref in outputs.items():
        assert ref["sha256"] == recorded["train"]["outputs"][name]["sha256"], name
    assert stages_of(root, "clean", 1)["checkpoint"]["status"] == "stale"
    rm(config_path=str(CONFIG), overrides=OVERRIDES, run_id="clean", storage_root=str(root))
    assert_bit_identical(before, checkpoint(root, "clean"))


def test_grpo_is_rewarded_by_the_trained_checkpoint(first_run, tmp_path):
    """The chain: GRPO's reward_model environment scores with the RM flow's checkpoint."""
    root, _ = first_run
    path = checkpoint(root, "clean")
    overrides = [
        "grpo.max_num_steps=1",
        "data.train.dataset_name=addition",
        "data.validation.dataset_name=addition",
        "data.default.prompt_file=null",  # the addition questions state the answer format
        "data.default.env_name=reward_model",
        f"+env.reward_model.model_name={path}",
    ]
    grpo(
        config_path=str(CONFIGS / "grpo_math_tiny.yaml"),
        overrides=overrides,
        run_id="chain",
        storage_root=str(tmp_path),
    )
    reward = stages_of(tmp_path, "chain", 0)["reward"]
    assert reward["status"] == "complete"
    storage = open_storage(RunRef(run_id="chain", storage_root=str(tmp_path)))
    rewards = storage.read_batch(ObjectRef.from_dict(reward["outputs"]["batch"]))["total_reward"]
    # a Bradley-Terry score, not the math environment's 0/1
    assert not torch.isin(rewards, torch.tensor([0.0, 1.0])).all()


def test_a_run_whose_pairs_are_all_too_long_fails_naming_the_key(tmp_path):
    """Every pair over policy.max_total_sequence_length is ignored (as in NeMo RL): the train
    stage refuses to commit a step that trained nothing, instead of ending green with an
    all-zero head."""
    no_validation = ["rm.val_period=0", "rm.val_at_start=false", "rm.val_at_end=false"]
    overrides = ["rm.max_num_steps=1", *no_validation, "policy.max_total_sequence_length=8"]
    with pytest.raises(Exception, match=r"fits policy.max_total_sequence_length=8") as err:
        rm(config_path=str(CONFIG), overrides=overrides, run_id="long", storage_root=str(tmp_path))
    assert "would train nothing" in str(err.value)
    assert open_storage(RunRef(str(tmp_path), "long")).committed_checkpoints() == []
