"""The logprob stage's forward shortcuts (``loss_fn.force_on_policy_ratio``,
``grpo.skip_reference_policy_logprobs_calculation``): same update, refused where unsafe."""

import pytest
import torch
from transformers import AutoTokenizer

from nemo_rl_core.algorithms.grpo import (
    build_loss_fn,
    compute_advantages,
    compute_logprobs,
    load_master_config,
)
from nemo_rl_core.algorithms.training import train_policy
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.utils.config import ConfigError

CONFIG = "examples/configs/grpo_math_tiny.yaml"
# 4 prompts x 4 generations = train_global_batch_size 16: one optimizer step per batch.
ON_POLICY = [
    "loss_fn.reference_policy_kl_penalty=0",
    "grpo.skip_reference_policy_logprobs_calculation=true",
]


def rollouts(vocab: int, prompts: int = 4, generations: int = 4) -> BatchedDataDict:
    """Scored rollouts of random tokens: prompts of 6-9 tokens, responses of 3-10, rewards
    mixed within each prompt's group so every advantage group is non-degenerate."""
    gen = torch.Generator().manual_seed(0)
    logs = []
    for _ in range(prompts * generations):
        prompt = torch.randint(
            4, vocab, (int(torch.randint(6, 10, (1,), generator=gen)),), generator=gen
        )
        response = torch.randint(
            4, vocab, (int(torch.randint(3, 11, (1,), generator=gen)),), generator=gen
        )
        logs.append(
            [
                {"role": "user", "token_ids": prompt},
                {
                    "role": "assistant",
                    "token_ids": response,
                    "generation_logprobs": -torch.rand(len(response), generator=gen),
                },
            ]
        )
    size = prompts * generations
    return BatchedDataDict(
        message_log=logs,
        loss_multiplier=torch.ones(size),
        total_reward=torch.tensor([1.0, 0.0, 0.0, 1.0] * prompts)[:size],
        prompt_index=torch.arange(prompts).repeat_interleave(generations),
    )


def one_step(model_dir, overrides: list[str]) -> tuple[dict[str, torch.Tensor], BatchedDataDict]:
    """Parameters after one GRPO step (logprob, advantage, train stages) from the initial model."""
    config = load_master_config(CONFIG, [f"policy.model_name={model_dir}", *ON_POLICY, *overrides])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    policy = make_policy(config.policy, tokenizer=tokenizer, init_reference_model=False)
    train_data = compute_logprobs(policy, rollouts(len(tokenizer)), tokenizer, config)
    train_data, _ = compute_advantages(train_data, config)
    train_policy(policy, train_data, build_loss_fn(config), config, iteration=0)
    params = {k: v.detach().clone() for k, v in policy.model.named_parameters()}
    return params, train_data


def test_force_on_policy_ratio_skips_the_forward_and_gives_the_same_step(tiny_model_dir):
    explicit, explicit_data = one_step(tiny_model_dir, [])
    shortcut, shortcut_data = one_step(tiny_model_dir, ["loss_fn.force_on_policy_ratio=true"])
    initial = make_policy(
        load_master_config(CONFIG, [f"policy.model_name={tiny_model_dir}"]).policy,
        init_optimizer=False,
        init_reference_model=False,
    )
    moved = max((explicit[k] - v).abs().max().item() for k, v in initial.model.named_parameters())
    assert moved > 1e-4, "the step must change the weights for the comparison to mean anything"
    assert explicit_data["prev_logprobs"].abs().sum() > 0
    assert not shortcut_data["prev_logprobs"].any(), "the prev_logprobs forward was skipped"
    assert not shortcut_data["reference_policy_logprobs"].any()
    for name, value in explicit.items():
        torch.testing.assert_close(shortcut[name], value, atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (
            ["loss_fn.force_on_policy_ratio=true", "policy.train_global_batch_size=8"],
            ["loss_fn.force_on_policy_ratio", "policy.train_global_batch_size=8", "= 16"],
        ),
        (
            [
                "loss_fn.force_on_policy_ratio=true",
                "loss_fn.use_kl_in_reward=true",
                "grpo.adv_estimator.name=reinforce_plus_plus",
            ],
            ["loss_fn.force_on_policy_ratio", "loss_fn.use_kl_in_reward"],
        ),
        (
            ["grpo.skip_reference_policy_logprobs_calculation=true"],
            [
                "grpo.skip_reference_policy_logprobs_calculation",
                "loss_fn.reference_policy_kl_penalty",
            ],
        ),
    ],
    ids=["several-steps-per-batch", "kl-in-reward", "reference-needed-by-kl"],
)
def test_unsafe_shortcuts_are_refused_naming_the_keys(overrides, keys):
    with pytest.raises(ConfigError) as err:
        load_master_config(CONFIG, overrides)
    for key in keys:
        assert key in str(err.value)
