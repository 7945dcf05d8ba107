"""GRPO (NeMo RL's ``nemo_rl.algorithms.grpo``): the work of each stage, and its config
classes by NeMo RL's names (they live in :mod:`~nemo_rl_core.algorithms.grpo_config`).

NeMo RL runs these steps inside one long ``grpo_train`` loop; here each is a pure function
that a Prefect task (``tasks/``) or a plain loop can call, so one stage of one iteration
can be recomputed alone from its stored inputs.
"""

import hashlib
import json
import time
from collections.abc import Iterable
from typing import Any

import torch

from nemo_rl_core.algorithms.advantage_estimator import (
    GRPOAdvantageEstimator,
    ReinforcePlusPlusAdvantageEstimator,
    create_advantage_estimator,
)
from nemo_rl_core.algorithms.config import GRPOAdvantageConfig
from nemo_rl_core.algorithms.filters import (
    accumulate_dynamic_sampling_batch,
    apply_overlong_filtering,
    dynamic_sampling_filter,
)

# NeMo RL names the config classes here (noqa: re-exported); they live apart so that the
# config check loads no torch.
from nemo_rl_core.algorithms.grpo_config import (
    AsyncGRPOConfig,  # noqa: F401
    DataPlaneConfig,  # noqa: F401
    GRPOConfig,  # noqa: F401
    MasterConfig,
    RLMasterConfig,
    RolloutLoopConfig,
    RolloutScheduleConfig,
    async_depth,  # noqa: F401
    data_setup,
    load_master_config,  # noqa: F401
    planned_steps,  # noqa: F401
    validates,  # noqa: F401
    validation_due,  # noqa: F401
)
from nemo_rl_core.algorithms.loss import ClippedPGLossFn
from nemo_rl_core.algorithms.reward_functions import (
    apply_reward_shaping,
    scale_rewards,
)
from nemo_rl_core.algorithms.utils import calculate_baseline_and_std_per_prompt
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import build_dataset
from nemo_rl_core.data.llm_message_utils import (
    batched_message_log_to_flat_message,
    message_logs_to_train_data,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.interfaces import EnvironmentInterface
from nemo_rl_core.environments.utils import create_env
from nemo_rl_core.experience.rollouts import (
    calculate_rewards,
    generate_responses,
    response_length_metrics,
    run_multi_turn_rollout,
)
from nemo_rl_core.models.generation.interfaces import GenerationInterface
from nemo_rl_core.models.policy.interfaces import PolicyInterface
from nemo_rl_core.models.value.interfaces import ValueInterface

# ``reward_reason`` prefixes of a check that did not finish (the worker pool's outcome kinds).
ENV_FAILURE_KINDS = ("error", "timeout", "died")


class EnvironmentFailureError(RuntimeError):
    """Too many reward checks failed in one batch: the environment, not the policy, is broken."""


def digest_json(value: Any) -> str:
    """A stable digest of JSON-able data (configs, dataloader states)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def make_task_to_env(config: RLMasterConfig) -> dict[str, EnvironmentInterface]:
    """One environment per ``env:`` entry, keyed by task name."""
    return {name: create_env(name, settings) for name, settings in config.env.items()}


def build_loss_fn(config: RLMasterConfig) -> ClippedPGLossFn:
    return ClippedPGLossFn(config.loss_fn)


def prompts_per_batch(loop: RolloutScheduleConfig) -> int:
    """Prompts per generation batch: ``num_prompts_per_step``, times ``batch_multiplier``
    under dynamic sampling (as NeMo RL sizes its dataloader; distillation has none)."""
    if isinstance(loop, RolloutLoopConfig) and loop.use_dynamic_sampling:
        return int(loop.num_prompts_per_step * loop.batch_multiplier)
    return loop.num_prompts_per_step


def make_dataloader(config: RLMasterConfig, tokenizer: Any) -> StatefulDataLoader:
    """The training dataloader: one generation batch of prompts per call, shuffled from the
    algorithm's seed as NeMo RL's is; the last partial batch of an epoch is dropped."""
    return StatefulDataLoader(
        build_dataset(config.data, tokenizer, setup=data_setup(config)),
        batch_size=prompts_per_batch(config.algorithm),
        shuffle=config.data.shuffle,
        seed=config.algorithm.seed,
        drop_last=True,
    )


def take_prompts(
    dataloader: StatefulDataLoader,
    config: RLMasterConfig,
    dataloader_state: dict,
    first_prompt_index: int = 0,
) -> tuple[BatchedDataDict, dict]:
    """The prompts after ``dataloader_state``, each repeated ``num_generations_per_prompt``
    times (``prompt_index`` names each group, from ``first_prompt_index``), and the
    dataloader state after taking them."""
    dataloader.load_state_dict(dataloader_state)
    batch = dataloader.next_batch()
    generations = config.algorithm.num_generations_per_prompt
    repeated = batch.repeat_interleave(generations)
    indices = torch.arange(first_prompt_index, first_prompt_index + batch.size)
    repeated["prompt_index"] = indices.repeat_interleave(generations)
    return repeated, dataloader.state_dict()


class DynamicSamplingExhaustedError(RuntimeError):
    """Dynamic sampling generated its maximum number of batches without filling one."""


def select_prompt_groups(
    batch: BatchedDataDict,
    kept_before: BatchedDataDict | None,
    config: RLMasterConfig,
    round_index: int,
) -> tuple[BatchedDataDict, bool, dict[str, Any]]:
    """DAPO's dynamic sampling, as NeMo RL does it: keep the samples whose prompt group's
    rewards vary (per-sample std > 0; the unshaped rewards when shaping is on), after
    those kept in earlier rounds. Complete at ``num_prompts_per_step x
    num_generations_per_prompt`` samples (cut to that); else another round generates more,
    until ``dynamic_sampling_max_gen_batches`` batches were processed."""
    loop = config.algorithm
    key = "unshaped_total_reward" if "unshaped_total_reward" in batch else "total_reward"
    rewards = batch[key]
    # ppo: has no leave-one-out key (its baseline is the value model): the plain group std.
    leave_one_out = isinstance(loop, GRPOAdvantageConfig) and loop.use_leave_one_out_baseline
    _, std = calculate_baseline_and_std_per_prompt(
        batch["prompt_index"], rewards, torch.ones_like(rewards), leave_one_out
    )
    filtered, metrics = dynamic_sampling_filter(batch, std)
    target = loop.num_prompts_per_step * loop.num_generations_per_prompt
    selected, complete = accumulate_dynamic_sampling_batch(kept_before, filtered, target)
    batches_done = round_index + 1
    if not complete and batches_done > loop.dynamic_sampling_max_gen_batches:
        raise DynamicSamplingExhaustedError(
            f"dynamic sampling processed {batches_done} generation batches and kept "
            f"{selected.size} of the {target} samples a step needs (grpo."
            f"dynamic_sampling_max_gen_batches={loop.dynamic_sampling_max_gen_batches}); "
            "the prompts are too easy or too hard for the policy: raise the limit, "
            "grpo.batch_multiplier or num_generations_per_prompt"
        )
    metrics |= {
        "dynamic_sampling_num_gen_batches": batches_done,
        "dynamic_sampling_kept_total": selected.size,
    }
    if complete:
        metrics["dynamic_sampling_num_discarded_valid_samples"] = (
            filtered.size + (kept_before.size if kept_before else 0) - target
        )
    return selected, complete, metrics


def generate_rollouts(
    generation: GenerationInterface,
    batch: BatchedDataDict,
    tokenizer: Any,
    task_to_env: dict[str, EnvironmentInterface],
    config: RLMasterConfig,
    iteration: int,
    round_index: int = 0,
    rows: tuple[int, int] | None = None,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Responses for every prompt, or for the prompts ``rows`` ``[start, end)`` of the batch
    (a shard of the stage), each sampled with its own seed, which its place in the whole
    batch decides; multi-turn tasks play the whole episode here. Each dynamic-sampling round
    of an iteration samples with seeds of its own."""
    stream = TRAIN_SEEDS + 2 * round_index  # odd streams are validation's
    seeds = sampling_seeds(config.algorithm.seed, iteration, batch.size, stream)
    if rows is not None:
        batch, seeds = batch.slice(*rows), seeds[rows[0] : rows[1]]
    generation.prepare_for_generation()
    try:
        return play_rollouts(generation, batch, tokenizer, task_to_env, config, seeds)
    finally:
        generation.finish_generation()


def play_rollouts(
    generation: GenerationInterface,
    batch: BatchedDataDict,
    tokenizer: Any,
    task_to_env: dict[str, EnvironmentInterface],
    config: RLMasterConfig,
    seeds: torch.Tensor,
    greedy: bool = False,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """One response per sample (multi-turn tasks: the whole episode, scored as it is played),
    sampled with ``seeds`` so that a rerun draws the same tokens."""
    if config.algorithm.max_rollout_turns > 1:
        # Each turn's seeds follow from these, so a rerun plays the same episodes.
        batch = BatchedDataDict({**batch, "sample_seeds": seeds})
        return run_multi_turn_rollout(
            generation,
            batch,
            tokenizer,
            task_to_env,
            config.policy.max_total_sequence_length,
            config.algorithm.max_rollout_turns,
            greedy=greedy,
        )
    return generate_one_turn(generation, batch, tokenizer, seeds, greedy=greedy)


# Seed streams: training samples (one stream per dynamic-sampling round) and validation
# samples never share a seed.
TRAIN_SEEDS, VALIDATION_SEEDS = 0, 1


def sampling_seeds(seed: int, iteration: int, size: int, stream: int = TRAIN_SEEDS) -> torch.Tensor:
    """Per-sample seeds of one iteration: a rerun or resumed stage samples the same tokens."""
    base = (seed * 1_000_003 + iteration * 10_007 + stream * 7_919_311) % (2**31 - size)
    return torch.arange(base, base + size, dtype=torch.int64)


def generate_one_turn(
    generation: GenerationInterface,
    batch: BatchedDataDict,
    tokenizer: Any,
    seeds: torch.Tensor,
    greedy: bool = False,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """One assistant turn per sample, left unscored: the reward stage asks the environments."""
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    flat, input_lengths = batched_message_log_to_flat_message(
        batch["message_log"], pad_value_dict={"token_ids": pad_id}
    )
    generation_input: BatchedDataDict[Any] = BatchedDataDict(
        {"input_ids": flat["token_ids"], "input_lengths": input_lengths, "sample_seeds": seeds}
    )
    batch, _, _ = generate_responses(
        generation, generation_input, batch, tokenizer, input_lengths, greedy=greedy
    )
    return batch, one_turn_metrics(batch)


def one_turn_metrics(rollouts: BatchedDataDict) -> dict[str, Any]:
    """Generation metrics of one-turn rollouts, from each sample's response (the last message
    of its log): the same for the batch generated whole or in slices joined again."""
    metrics: dict[str, Any] = response_length_metrics(
        [len(log[-1]["token_ids"]) for log in rollouts["message_log"]]
    )
    # NeMo RL's one-turn rollouts go through its multi-turn loop, which reports this name.
    metrics["mean_gen_tokens_per_sample"] = metrics["mean_generation_length"]
    return metrics


def score_rollouts(
    batch: BatchedDataDict, task_to_env: dict[str, EnvironmentInterface], config: RLMasterConfig
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Rewards from the environments (multi-turn episodes were scored while played).

    A sample whose checker raised, timed out or died has reward 0 and the reason in its
    ``extra_env_info["reward_reason"]``; they are counted in the metrics, and past
    ``max_env_failure_fraction`` of the batch this raises ``EnvironmentFailureError``."""
    scored = score_samples(batch, task_to_env, config)
    return scored, reward_metrics(scored, config)


def score_samples(
    batch: BatchedDataDict, task_to_env: dict[str, EnvironmentInterface], config: RLMasterConfig
) -> BatchedDataDict:
    """Each sample's reward and its environment's metadata: sample by sample, so a batch
    scored in slices and joined again is the batch scored whole (the reward stage's shards)."""
    if config.algorithm.max_rollout_turns == 1:
        env_return = calculate_rewards(batch, task_to_env)
        batch["total_reward"] = env_return.rewards.to(torch.float32)
        batch["extra_env_info"] = list(env_return.metadata)
    return batch


def reward_metrics(batch: BatchedDataDict, config: RLMasterConfig) -> dict[str, Any]:
    """The scored batch's reward metrics and failed checks; ``EnvironmentFailureError`` past
    ``max_env_failure_fraction``."""
    failures: dict[str, int] = dict.fromkeys(ENV_FAILURE_KINDS, 0)
    if config.algorithm.max_rollout_turns == 1:
        for meta in batch["extra_env_info"]:
            kind = str((meta or {}).get("reward_reason", "")).split(":", 1)[0]
            if kind in failures:
                failures[kind] += 1
    rewards = batch["total_reward"]
    failed_fraction = sum(failures.values()) / max(len(rewards), 1)
    if failed_fraction > config.algorithm.max_env_failure_fraction:
        raise EnvironmentFailureError(
            f"{sum(failures.values())} of {len(rewards)} reward checks failed ({failures}), "
            f"more than max_env_failure_fraction={config.algorithm.max_env_failure_fraction}"
        )
    return {
        "mean_reward": float(rewards.mean()),
        "max_reward": float(rewards.max()),
        "fraction_positive": float((rewards > 0).float().mean()),
        **{f"env_{kind}_count": count for kind, count in failures.items()},
        "env_failed_fraction": failed_fraction,
    }


def validate(
    policy_generation: GenerationInterface,
    val_dataloader: Iterable[BatchedDataDict],
    tokenizer: Any,
    val_task_to_env: dict[str, EnvironmentInterface],
    step: int,
    master_config: RLMasterConfig,
    logger: Any = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """NeMo RL's validation: the weights ``policy_generation`` holds, on at most
    ``max_val_samples`` prompts of ``val_dataloader`` (``val_batch_size`` per batch); returns
    ``(val_metrics, timing_metrics)``. ``logger`` gets the metrics under ``validation``."""
    started = time.perf_counter()
    _, metrics = validate_batches(
        policy_generation, val_dataloader, tokenizer, val_task_to_env, master_config, step
    )
    if logger is not None:
        logger.log_metrics(metrics, step, prefix="validation")
    return metrics, {"total_validation_time": time.perf_counter() - started}


def validate_batches(
    generation: GenerationInterface,
    batches: Iterable[BatchedDataDict],
    tokenizer: Any,
    task_to_env: dict[str, EnvironmentInterface],
    config: RLMasterConfig,
    step: int,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Every sample's validation result and the metrics of the weights of ``step``.

    Each prompt gets ``num_generations_per_prompt`` sampled responses (the generation
    settings, seeded apart from training's) and one greedy response. ``accuracy`` is NeMo
    RL's (mean reward of the sampled responses), ``pass@k`` the fraction of prompts with a
    rewarded sample among k, ``greedy_accuracy`` the mean reward of the greedy responses.
    A sample counts as solved when its reward is positive.
    """
    loop = config.algorithm
    k = loop.num_generations_per_prompt
    limit = loop.max_val_samples
    batch_size = loop.val_batch_size
    if limit is not None and batch_size is not None:
        limit = (limit // batch_size) * batch_size  # NeMo RL validates whole batches
    results: list[BatchedDataDict] = []
    taken = 0
    generation.prepare_for_generation()
    try:
        for prompts in batches:
            if limit is not None and taken >= limit:
                break
            if limit is not None and taken + prompts.size > limit:
                prompts = prompts.slice(0, limit - taken)
            prompts["prompt_index"] = torch.arange(taken, taken + prompts.size)
            sampled = prompts.repeat_interleave(k)
            seeds = sampling_seeds(loop.seed, step, (taken + prompts.size) * k, VALIDATION_SEEDS)
            sampled, _ = play_rollouts(
                generation, sampled, tokenizer, task_to_env, config, seeds[taken * k :]
            )
            greedy, _ = play_rollouts(
                generation, prompts, tokenizer, task_to_env, config, seeds[: prompts.size], True
            )
            for played, is_greedy in ((sampled, False), (greedy, True)):
                scored, _ = score_rollouts(played, task_to_env, config)
                scored["greedy"] = torch.full((scored.size,), is_greedy)
                results.append(scored)
            taken += prompts.size
    finally:
        generation.finish_generation()
    if not results:
        raise ValueError("validation has no prompts: the validation dataset is empty")
    table: BatchedDataDict[Any] = BatchedDataDict.from_batches(results)
    return table, validation_metrics(table, k)


def validation_metrics(table: BatchedDataDict, k: int) -> dict[str, Any]:
    """``accuracy``, ``pass@k``, ``greedy_accuracy`` and ``avg_length`` of a validation table."""
    greedy = table["greedy"].bool()
    rewards = table["total_reward"].float()
    sampled_rewards = rewards[~greedy]
    prompt_ids = table["prompt_index"][~greedy]
    solved = torch.zeros(int(prompt_ids.max()) + 1, dtype=torch.bool)
    solved.index_put_((prompt_ids,), sampled_rewards > 0, accumulate=True)
    lengths = response_lengths(table).float()
    return {
        "accuracy": float(sampled_rewards.mean()),
        f"pass@{k}": float(solved.float().mean()),
        "greedy_accuracy": float(rewards[greedy].mean()),
        "avg_length": float(lengths[~greedy].mean()),
        "num_prompts": int(greedy.sum()),
    }


def process_rewards(
    batch: BatchedDataDict, config: RLMasterConfig
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """What NeMo RL does to scored rollouts before the advantages, in its order: scale the
    rewards (``reward_scaling``), shape them (``reward_shaping``: DAPO's overlong penalty
    or the stop-properly penalty; the unshaped rewards are kept for dynamic sampling), and
    take truncated responses out of the loss (``overlong_filtering``: their
    ``loss_multiplier`` becomes 0)."""
    loop = config.algorithm
    metrics: dict[str, Any] = {}
    batch = scale_rewards(batch, loop.reward_scaling)
    if loop.reward_shaping.enabled:
        batch = apply_reward_shaping(batch, loop.reward_shaping)
        metrics["mean_shaped_reward"] = float(batch["total_reward"].mean())
    if loop.overlong_filtering:
        multiplier = torch.as_tensor(batch["loss_multiplier"], dtype=torch.float32)
        batch["loss_multiplier"] = apply_overlong_filtering(multiplier, batch["truncated"])
        metrics["overlong_filtered_fraction"] = float(
            torch.as_tensor(batch["truncated"]).float().mean()
        )
    return batch, metrics


def response_lengths(batch: BatchedDataDict) -> torch.Tensor:
    """Generated tokens of each sample (all its assistant turns)."""
    return torch.tensor(
        [
            sum(len(m["token_ids"]) for m in log if m["role"] == "assistant")
            for log in batch["message_log"]
        ],
        dtype=torch.long,
    )


def compute_logprobs(
    policy: PolicyInterface, batch: BatchedDataDict, tokenizer: Any, config: RLMasterConfig
) -> BatchedDataDict:
    """Flat training inputs of the rollouts with the policy's and reference's logprobs."""
    train_data = logprob_inputs(batch, tokenizer, config)
    train_data.update(policy_logprobs(policy, train_data, config))
    return train_data


def logprob_inputs(
    batch: BatchedDataDict, tokenizer: Any, config: RLMasterConfig
) -> BatchedDataDict:
    """The flat training inputs of the scored rollouts (padded to the batch's longest)."""
    train_data = message_logs_to_train_data(
        batch["message_log"],
        pad_token_id=tokenizer.pad_token_id,
        make_sequence_length_divisible_by=config.policy.make_sequence_length_divisible_by,
    )
    train_data["sample_mask"] = torch.as_tensor(batch["loss_multiplier"], dtype=torch.float32)
    train_data["total_reward"] = batch["total_reward"]
    train_data["prompt_index"] = batch["prompt_index"]
    return train_data


def policy_logprobs(
    policy: PolicyInterface, train_data: BatchedDataDict, config: RLMasterConfig
) -> BatchedDataDict:
    """``prev_logprobs`` and ``reference_policy_logprobs`` of the training inputs.

    As in NeMo RL, each forward is skipped when its output is unused, and stored as zeros
    so the stage's columns stay the same: ``prev_logprobs`` with
    ``loss_fn.force_on_policy_ratio`` (the loss takes the current logprobs, detached),
    the reference's with ``skip_reference_policy_logprobs_calculation`` (KL penalty 0);
    the config validation refuses the combinations that would read them."""
    skipped = torch.zeros_like(train_data["generation_logprobs"])
    logprobs: BatchedDataDict = BatchedDataDict()
    if config.loss_fn.force_on_policy_ratio:
        logprobs["prev_logprobs"] = skipped
    else:
        logprobs["prev_logprobs"] = policy.get_logprobs(train_data)["logprobs"]
    if config.algorithm.skip_reference_policy_logprobs_calculation:
        logprobs["reference_policy_logprobs"] = skipped.clone()
    else:
        logprobs["reference_policy_logprobs"] = policy.get_reference_policy_logprobs(train_data)[
            "reference_logprobs"
        ]
    return logprobs


def compute_advantages(
    train_data: BatchedDataDict, config: MasterConfig
) -> tuple[BatchedDataDict, dict]:
    """Per-prompt baselines and the advantage of every token (GRPO / Reinforce++)."""
    estimator = create_advantage_estimator(config.grpo.resolved_adv_estimator(), config.loss_fn)
    if not isinstance(estimator, GRPOAdvantageEstimator | ReinforcePlusPlusAdvantageEstimator):
        raise ValueError(
            f"grpo.adv_estimator: {type(estimator).__name__} needs a value model; "
            "GRPO takes grpo or reinforce_plus_plus"
        )
    device = "cuda" if config.grpo.calculate_advantages_on_gpu else "cpu"
    advantages = estimator.compute_advantage(
        prompt_ids=train_data["prompt_index"].to(device),
        rewards=train_data["total_reward"].to(device),
        mask=train_data["token_mask"].to(device),
        logprobs_policy=train_data["prev_logprobs"].to(device),
        logprobs_reference=train_data["reference_policy_logprobs"].to(device),
    )
    train_data["advantages"] = clip_advantages(advantages.cpu(), config.grpo)
    metrics = mask_by_sequence_logprob_error(train_data, config.grpo.seq_logprob_error_threshold)
    baseline, std = calculate_baseline_and_std_per_prompt(
        train_data["prompt_index"],
        train_data["total_reward"],
        torch.ones_like(train_data["total_reward"]),
    )
    return train_data, {
        **metrics,
        "mean_baseline": float(baseline.mean()),
        "mean_reward_std": float(std.mean()),
        **advantage_metrics(train_data, baseline),
    }


def advantage_metrics(train_data: BatchedDataDict, baseline: torch.Tensor) -> dict[str, float]:
    """NeMo RL's per-step view of the advantages (over response tokens), of the groups'
    baselines (the share, in percent, of samples whose group always or never scored 1)
    and of the tokens in the batch (prompts and responses)."""
    response = train_data["advantages"][train_data["token_mask"].bool()].float()
    pct_0 = 100 * float((baseline == 0).float().mean())
    pct_1 = 100 * float((baseline == 1).float().mean())
    empty = response.numel() == 0
    return {
        "advantages/mean": 0.0 if empty else float(response.mean()),
        "advantages/max": 0.0 if empty else float(response.max()),
        "advantages/min": 0.0 if empty else float(response.min()),
        "advantages/sum": float(response.sum()),
        "baseline_reward/pct_0": pct_0,
        "baseline_reward/pct_1": pct_1,
        "baseline_reward/pct_mixed": 100 - pct_0 - pct_1,
        "total_num_tokens": float(train_data["input_lengths"].sum()),
    }


def mask_by_sequence_logprob_error(
    train_data: BatchedDataDict, threshold: float | None
) -> dict[str, float]:
    """How far the trainer's probabilities of each sampled sequence are from the generator's
    (NeMo RL's per-sequence token_mult_prob_error: the mean over its tokens of
    exp|log pi_gen - log pi_old|); with ``threshold``, sequences above it leave the loss
    (their ``sample_mask`` becomes 0)."""
    token_mask = train_data["token_mask"][:, 1:]
    sample_mask = train_data["sample_mask"].to(torch.float32)
    error = (train_data["generation_logprobs"] - train_data["prev_logprobs"])[:, 1:].abs()
    mask = token_mask * sample_mask.unsqueeze(-1)
    counts = mask.sum(-1)
    valid = counts > 0
    per_sequence = ((error * mask).exp() * mask).sum(-1) / counts.clamp(min=1)

    def spread(values: torch.Tensor, prefix: str) -> dict[str, float]:
        empty = values.numel() == 0
        return {
            f"max_{prefix}": 0.0 if empty else values.max().item(),
            f"mean_{prefix}": 0.0 if empty else values.mean().item(),
            f"min_{prefix}": 0.0 if empty else values.min().item(),
        }

    metrics = spread(per_sequence[valid], "seq_mult_prob_error")
    if threshold is None:
        return metrics
    kept = (per_sequence <= threshold).float() * sample_mask
    dropped = (sample_mask - kept).bool()
    rewards = train_data["total_reward"].reshape(-1)
    train_data["sample_mask"] = kept
    return {
        **metrics,
        **spread(per_sequence[kept.bool() & valid], "seq_mult_prob_error_after_mask"),
        "num_masked_seqs_by_logprob_error": int(dropped.sum()),
        "masked_correct_pct": float((rewards[dropped] == 1).float().mean())
        if dropped.any()
        else 0.0,
    }


def clip_advantages(advantages: torch.Tensor, loop: GRPOAdvantageConfig) -> torch.Tensor:
    """Clamp to [``advantage_clip_low``, ``advantage_clip_high``] (either may be None): a
    tiny group std can blow the normalized advantages up."""
    low, high = loop.advantage_clip_low, loop.advantage_clip_high
    if low is None and high is None:
        return advantages
    return advantages.clamp(min=low, max=high)


def train_policy(
    policy: PolicyInterface | ValueInterface,
    train_data: BatchedDataDict,
    loss_fn: Any,
    config: RLMasterConfig,
    iteration: int,
    gbs: int | None = None,
    mbs: int | None = None,
) -> dict[str, Any]:
    """One optimizer step on the iteration's batch (PPO's value model trains here too); a
    non-finite loss fails with the iteration. ``gbs``/``mbs``: the policy's own sizes
    unless given (preference pairs are two sequences each)."""
    policy.prepare_for_training()
    try:
        results = policy.train(train_data, loss_fn, gbs=gbs, mbs=mbs)
    except FloatingPointError as err:  # the policy's own NaN/Inf check does not know the step
        raise FloatingPointError(f"iteration {iteration}: {err}") from err
    finally:
        policy.finish_training()
    metrics = merge_step_metrics(results)
    bad = [
        k
        for k in ("loss", "grad_norm")
        if k in metrics and not torch.isfinite(torch.tensor(metrics[k]))
    ]
    if bad:
        raise FloatingPointError(f"iteration {iteration}: non-finite {bad} in training: {metrics}")
    return metrics


# Settings and counts every microbatch repeats: NeMo RL logs their mean.
_REPEATED_METRICS = frozenset({"lr", "wd", "global_valid_seqs", "global_valid_toks"})


def merge_step_metrics(results: dict[str, Any]) -> dict[str, float]:
    """One number per metric of a training step, reduced over its microbatches as NeMo RL's
    ``grpo_train`` does: the loss's metrics are shares of the global batch's (normalised
    by its valid tokens or sequences), so they add up; ``*_min``/``*_max`` take the
    extreme of the finite values (-1 if none: every microbatch was empty); settings and
    counts each microbatch repeats take the mean."""
    per_microbatch = {
        "loss": results["loss"],
        "grad_norm": results["grad_norm"],
        **results.get("all_mb_metrics", {}),
    }
    merged: dict[str, float] = {}
    for key, values in per_microbatch.items():
        flat = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
        if flat.numel() == 0:
            continue
        if key.endswith(("_min", "_max")):
            finite = flat[torch.isfinite(flat)]
            if finite.numel() == 0:
                merged[key] = -1.0
            else:
                merged[key] = float(finite.min() if key.endswith("_min") else finite.max())
        elif key in _REPEATED_METRICS:
            merged[key] = float(flat.mean())
        else:
            merged[key] = float(flat.sum())
    return merged
