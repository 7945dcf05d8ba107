"""The training and generation backends on a CUDA GPU, skipped where there is none.

The CPU suite checks every backend against plain math; here the same code runs with its
tensors on the GPU and must agree with the CPU (fp32, TF32 off) and train in bf16. Run
them where a GPU is lent: ``pytest -m gpu tests/gpu``."""

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from policy_testing import manual_logprobs, policy_config, token_batch
from transformers import AutoModelForCausalLM

from nemo_rl_core.algorithms.loss import NLLLossFn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation import (
    GenerationConfig,
    configure_generation_config,
    make_generation,
)
from nemo_rl_core.models.policy import make_policy

if TYPE_CHECKING:  # megatron-core loads only where a Megatron test runs
    from nemo_rl_core.models.policy.hf_policy import HFPolicy
    from nemo_rl_core.models.policy.megatron_policy import MegatronPolicy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
FP32_TOLERANCE = 1e-4  # CPU and GPU kernels sum in different orders


@pytest.fixture(autouse=True)
def _exact_fp32_matmuls() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def test_policy_logprobs_on_the_gpu_equal_the_cpu(tiny_model_dir: Path) -> None:
    policy = make_policy(policy_config(tiny_model_dir), init_optimizer=False)
    assert next(policy.model.parameters()).is_cuda
    data = token_batch()
    got = policy.get_logprobs(data)["logprobs"].cpu()
    torch.testing.assert_close(
        got, manual_logprobs(tiny_model_dir, data), atol=FP32_TOLERANCE, rtol=0
    )


def test_bf16_training_on_the_gpu_learns_and_saves_a_cpu_loadable_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    policy = make_policy(policy_config(tiny_model_dir, precision="bfloat16"))
    data = token_batch()
    losses = [float(policy.train(data, NLLLossFn())["loss"]) for _ in range(8)]
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < 0.8 * losses[0], losses
    policy.save_checkpoint(str(tmp_path / "weights"), str(tmp_path / "optimizer"))
    reloaded = make_policy(
        policy_config(tmp_path / "weights", precision="float32"), init_optimizer=False
    )
    trained = reloaded.get_logprobs(data)["logprobs"].cpu()
    mask = data["token_mask"].bool()
    assert trained[mask].mean() > manual_logprobs(tiny_model_dir, data)[mask].mean()


def gpu_bytes_freed_by_a_refit(policy: "HFPolicy | MegatronPolicy") -> int:
    """GPU memory a colocated policy gives back over a refit: offload before, the weights
    sent, offload after."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    policy.offload_before_refit()
    policy.state_dict_for_refit()
    policy.offload_after_refit()
    return before - torch.cuda.memory_allocated()


def test_offload_after_refit_frees_the_gpu_and_the_next_steps_compute_the_same(
    tiny_model_dir: Path,
) -> None:
    """NeMo RL's colocated lifecycle: weights, reference model and optimizer state leave
    the GPU after a refit and come back for the next pass, which computes as if they never
    left (the same kernels on the same bytes)."""
    config = policy_config(tiny_model_dir)
    kept, offloaded = make_policy(config), make_policy(config)
    data = token_batch()
    for policy in (kept, offloaded):
        policy.train(data, NLLLossFn())  # the optimizer holds its moments now
    freed = gpu_bytes_freed_by_a_refit(offloaded)
    held = sum(
        t.numel() * t.element_size()
        for module in (offloaded.model, offloaded.reference_model)
        for t in module.parameters()
    )
    assert freed >= held, (freed, held)  # the weights, the reference and the moments left
    assert not next(offloaded.model.parameters()).is_cuda
    torch.testing.assert_close(
        offloaded.get_logprobs(data)["logprobs"], kept.get_logprobs(data)["logprobs"]
    )
    offloaded.prepare_for_training()
    assert offloaded.train(data, NLLLossFn())["loss"] == kept.train(data, NLLLossFn())["loss"]


def test_hf_generation_on_the_gpu_decodes_the_cpu_greedy_tokens(tiny_model_dir: Path) -> None:
    config = GenerationConfig.model_validate(
        {
            "backend": "hf",
            "max_new_tokens": 12,
            "vllm_cfg": {"precision": "float32", "max_model_len": 128},
        }
    )
    engine = make_generation(config, tiny_model_dir)
    prompts = token_batch(batch=4, seq=10)
    out = engine.generate(
        BatchedDataDict(input_ids=prompts["input_ids"], input_lengths=prompts["input_lengths"]),
        greedy=True,
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for i in range(prompts.size):
        length = int(prompts["input_lengths"][i])
        prompt = prompts["input_ids"][i, :length].tolist()
        generated = int(out["generation_lengths"][i])
        tokens = out["output_ids"][i, length : length + generated].tolist()
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(generated):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert tokens == ids[length:], f"sample {i}"


MEGATRON_CFG = {
    "enabled": True,
    "optimizer": {"lr": 1e-3, "min_lr": 1e-3, "weight_decay": 0.0},
    "scheduler": {"lr_warmup_iters": 0, "lr_warmup_init": 1e-3},
}


@pytest.mark.megatron
def test_megatron_policy_on_the_gpu_equals_hf_and_learns(tiny_model_dir: Path) -> None:
    pytest.importorskip("megatron.core")
    policy = make_policy(policy_config(tiny_model_dir, megatron_cfg=MEGATRON_CFG))
    try:
        data = token_batch()
        got = policy.get_logprobs(data)["logprobs"].cpu()
        want = manual_logprobs(tiny_model_dir, data)
        torch.testing.assert_close(got, want, atol=FP32_TOLERANCE, rtol=0)
        losses = [float(policy.train(data, NLLLossFn())["loss"]) for _ in range(8)]
        assert losses[-1] < 0.8 * losses[0], losses
    finally:
        policy.shutdown()


@pytest.mark.megatron
def test_megatron_ranks_free_the_gpu_after_a_refit_and_train_on_the_same(
    tiny_model_dir: Path,
) -> None:
    """NeMo RL's colocated lifecycle on Megatron: the parameters (inside DDP's buffers),
    gradient buffers, optimizer state and reference weights leave the GPU after a refit and
    the next steps compute what a policy that kept them computes."""
    pytest.importorskip("megatron.core")
    config = policy_config(tiny_model_dir, megatron_cfg=MEGATRON_CFG)
    data = token_batch()
    kept = make_policy(config)
    try:
        want = [float(kept.train(data, NLLLossFn())["loss"]) for _ in range(3)]
    finally:
        kept.shutdown()
    offloaded = make_policy(config)
    try:
        got = [float(offloaded.train(data, NLLLossFn())["loss"])]
        for _ in range(2):
            freed = gpu_bytes_freed_by_a_refit(offloaded)
            weights = sum(
                t.numel() * t.element_size() for t in offloaded.state_dict_for_refit().values()
            )
            offloaded.offload_after_refit()
            assert freed >= 2 * weights, (freed, weights)  # weights, reference, moments, grads
            offloaded.prepare_for_training()
            got.append(float(offloaded.train(data, NLLLossFn())["loss"]))
        assert got == want
    finally:
        offloaded.shutdown()


def test_a_grpo_iteration_of_the_core_steps_runs_on_the_gpu(tiny_model_dir: Path) -> None:
    """Prompts -> HF generation -> math rewards -> logprobs -> advantages -> a train step,
    all with the policy on the GPU, whatever the generation backends installed
    (``bench/gpu_check.sh`` runs the flow's iteration with vLLM-CUDA)."""
    from nemo_rl_core.algorithms import grpo, prompt_batches, rollout_generation, scoring, training

    config = grpo.load_master_config(
        "examples/configs/grpo_math_tiny.yaml",
        [f"policy.model_name={tiny_model_dir}", "policy.generation.backend=hf"],
    )
    policy = make_policy(config.policy)
    tokenizer = policy.tokenizer
    envs = scoring.make_task_to_env(config)
    settings = configure_generation_config(config.policy.generation, tokenizer)
    engine = make_generation(settings, tiny_model_dir, seed=config.grpo.seed)
    loader = prompt_batches.make_dataloader(config, tokenizer)
    prompts, _ = prompt_batches.take_prompts(loader, config, loader.state_dict())
    rollouts, _ = rollout_generation.generate_rollouts(engine, prompts, tokenizer, envs, config, 0)
    scored, reward_metrics = scoring.score_rollouts(rollouts, envs, config)
    train_data = grpo.compute_logprobs(policy, scored, tokenizer, config)
    mask = train_data["token_mask"].bool()
    gap = (train_data["prev_logprobs"] - train_data["generation_logprobs"])[mask].abs()
    assert gap.max() < 1e-3, "the GPU policy scores the sampled tokens as the sampler did"
    train_data, _ = grpo.compute_advantages(train_data, config)
    metrics = training.train_policy(policy, train_data, grpo.build_loss_fn(config), config, 0)
    assert torch.isfinite(torch.tensor(float(reward_metrics["mean_reward"])))
    assert torch.isfinite(torch.as_tensor(metrics["loss"])).all(), metrics
    for env in envs.values():
        env.shutdown()
