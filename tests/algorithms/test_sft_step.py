"""One SFT step and the validation loss on real conversation batches: sequence packing and
dynamic batching (NeMo RL's policy keys) train on the same loss as padded microbatches,
and validation changes no weight."""

from pathlib import Path

import pytest
import torch

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.algorithms.loss import NLLLossFn
from nemo_rl_core.algorithms.sft import (
    SFTMasterConfig,
    make_dataloader,
    take_batch,
    validation_batches,
    validation_loss,
)
from nemo_rl_core.algorithms.training import train_policy
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.models.policy.hf_loading import load_tokenizer

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "sft_tiny.yaml"
BUDGET = 128  # two conversations (policy.max_total_sequence_length: 64) per microbatch
LAYOUTS = {
    "padded": [],
    "packed": ["policy.sequence_packing.enabled=true", f"policy.sequence_packing.train_mb_tokens={BUDGET}"],
    "dynamic": ["policy.dynamic_batching.enabled=true", f"policy.dynamic_batching.train_mb_tokens={BUDGET}"],
}  # fmt: skip


def sft_step(model_dir: Path, layout: str) -> tuple[dict, dict, dict]:
    overrides = [f"policy.model_name={model_dir}", "sft.val_batches=1", *LAYOUTS[layout]]
    config = load_master_config(str(CONFIG), overrides, SFTMasterConfig)
    assert isinstance(config, SFTMasterConfig)
    tokenizer = load_tokenizer(config.policy)
    loader = make_dataloader(config, tokenizer)
    batch, _ = take_batch(loader, config, tokenizer, loader.state_dict())
    torch.manual_seed(0)
    policy = make_policy(config.policy, tokenizer=tokenizer, init_reference_model=False)
    before = validation_loss(policy, validation_batches(config, tokenizer), NLLLossFn(), config)
    again = validation_loss(policy, validation_batches(config, tokenizer), NLLLossFn(), config)
    assert again == before  # eval mode: no update
    metrics = train_policy(policy, batch, NLLLossFn(), config, 0)
    after = validation_loss(policy, validation_batches(config, tokenizer), NLLLossFn(), config)
    return before, metrics, after


@pytest.fixture(scope="module")
def padded(tiny_model_dir: Path) -> tuple[dict, dict, dict]:
    return sft_step(tiny_model_dir, "padded")


def test_one_step_lowers_the_validation_loss(padded):
    before, metrics, after = padded
    assert after["val_loss"] < before["val_loss"]
    assert metrics["loss"] == pytest.approx(before["val_loss"], rel=0.05)  # same distribution
    assert before["val_tokens"] == after["val_tokens"] > 0


@pytest.mark.parametrize("layout", ["packed", "dynamic"])
def test_packing_and_dynamic_batching_train_on_the_same_loss(tiny_model_dir, padded, layout):
    before, metrics, after = sft_step(tiny_model_dir, layout)
    assert before["val_loss"] == pytest.approx(padded[0]["val_loss"], abs=1e-5)
    assert metrics["loss"] == pytest.approx(padded[1]["loss"], abs=1e-5)
    assert after["val_loss"] == pytest.approx(padded[2]["val_loss"], abs=1e-4)
