"""Rollouts of NeMo RL (``nemo_rl.experience.rollouts``): generate, ask the environment, repeat.

A batch of ``DatumSpec``s (each with a tokenized ``message_log``, ``task_name`` and
``extra_env_info``) is played turn by turn: the policy answers every active sample, each
sample's environment answers back, and samples leave the loop when their environment
ends the episode, when they reach ``max_seq_len`` tokens, or after ``max_rollout_turns``.
Every turn appended to a message log carries its own ``token_ids`` (assistant turns also
``generation_logprobs``), so a sample's tokens are always the concatenation of its turns
and never exceed ``max_seq_len``. Works with any ``GenerationInterface``.
"""

import time
from typing import Any

import torch

from nemo_rl_core.data.interfaces import DatumSpec
from nemo_rl_core.data.llm_message_utils import (
    batched_message_log_to_flat_message,
    get_keys_from_message_log,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.interfaces import EnvironmentInterface, EnvironmentReturn
from nemo_rl_core.models.generation.interfaces import GenerationDatumSpec, GenerationInterface


def generate_responses(
    policy_generation: GenerationInterface,
    generation_input_data: BatchedDataDict[GenerationDatumSpec],
    batch: BatchedDataDict[DatumSpec],
    tokenizer: Any,
    input_lengths: torch.Tensor,
    include_logprobs: bool = True,
    greedy: bool = False,
) -> tuple[BatchedDataDict[DatumSpec], list[torch.Tensor], dict[str, float | int]]:
    """Generate one assistant turn per sample and append it to the sample's message log.

    Returns the batch (message logs extended in place; ``truncated`` set where a response
    hit its token budget without a stop), the generated token ids of each sample, and
    generation metrics (mean/max/total generated tokens).
    """
    if "stop_strings" not in generation_input_data:
        stop_strings = batch.get("stop_strings")
        generation_input_data["stop_strings"] = stop_strings or [None] * len(input_lengths)
    outputs = policy_generation.generate(generation_input_data, greedy=greedy)
    total_lengths = outputs["unpadded_sequence_lengths"]
    generated_ids = [
        outputs["output_ids"][i, int(input_lengths[i]) : int(total_lengths[i])]
        for i in range(len(input_lengths))
    ]
    texts = tokenizer.batch_decode(generated_ids, skip_special_tokens=True)
    for i, (ids, text) in enumerate(zip(generated_ids, texts, strict=True)):
        message = {"role": "assistant", "content": text, "token_ids": ids}
        if include_logprobs and "logprobs" in outputs:
            start, end = int(input_lengths[i]), int(total_lengths[i])
            message["generation_logprobs"] = outputs["logprobs"][i, start:end]
        batch["message_log"][i].append(message)
    if "truncated" in outputs:
        batch["truncated"] = outputs["truncated"].clone()
    metrics = response_length_metrics([len(ids) for ids in generated_ids])
    return batch, generated_ids, metrics


def response_length_metrics(lengths: list[int]) -> dict[str, float | int]:
    """Mean, longest and total generated tokens of a batch's responses."""
    tokens = torch.tensor(lengths, dtype=torch.float32)
    return {
        "mean_generation_length": tokens.mean().item() if len(tokens) else 0.0,
        "max_generation_length": int(tokens.max().item()) if len(tokens) else 0,
        "total_generated_tokens": int(tokens.sum().item()),
    }


def calculate_rewards(
    batch: BatchedDataDict[DatumSpec],
    task_to_env: dict[str, EnvironmentInterface],
) -> EnvironmentReturn:
    """Step each sample's environment (by ``task_name``) and merge the answers in batch order."""
    task_names = batch["task_name"]
    by_task: dict[str, list[int]] = {}
    for i, name in enumerate(task_names):
        if name not in task_to_env:
            raise KeyError(
                f"sample {i} has task_name {name!r} but task_to_env only has "
                f"{sorted(task_to_env)}; add an environment for it"
            )
        by_task.setdefault(name, []).append(i)
    size = len(task_names)
    observations: list[Any] = [None] * size
    metadata: list[Any] = [None] * size
    stop_strings: list[Any] = [None] * size
    answers: list[Any] = [None] * size
    rewards: torch.Tensor | None = None
    terminateds = torch.zeros(size, dtype=torch.bool)
    for name, indices in by_task.items():
        result = task_to_env[name].step(
            [batch["message_log"][i] for i in indices],
            [batch["extra_env_info"][i] for i in indices],
        )
        for j, i in enumerate(indices):
            observations[i] = result.observations[j]
            metadata[i] = result.metadata[j]
            stop_strings[i] = result.next_stop_strings[j]
            answers[i] = result.answers[j] if result.answers is not None else None
        # [n] from a single-reward environment, [n, K] from a multi-reward one (GDPO's)
        task_rewards = result.rewards.to(torch.float32).reshape(len(indices), -1)
        if rewards is None:
            rewards = torch.zeros(size, task_rewards.shape[1], dtype=torch.float32)
        if task_rewards.shape[1] != rewards.shape[1]:
            raise ValueError(
                f"task {name!r}'s environment gives {task_rewards.shape[1]} reward(s) per "
                f"sample, another task's {rewards.shape[1]}: one batch's environments must "
                "agree on the number of reward components"
            )
        rewards[indices] = task_rewards
        terminateds[indices] = result.terminateds.to(torch.bool).reshape(-1)
    if rewards is None:
        rewards = torch.zeros(size, 1, dtype=torch.float32)
    flat = rewards.squeeze(1) if rewards.shape[1] == 1 else rewards
    return EnvironmentReturn(observations, metadata, stop_strings, flat, terminateds, answers)


def store_rewards(batch: BatchedDataDict, rewards: torch.Tensor) -> None:
    """``rewards`` of every sample into ``batch``: ``total_reward``, and for a multi-reward
    environment's ``[B, K]`` their sum and each component (``reward1`` ... ``rewardK``, as
    NeMo RL's rollouts give them to GDPO)."""
    rewards = rewards.to(torch.float32)
    if rewards.dim() == 1:
        batch["total_reward"] = rewards
        return
    batch["total_reward"] = rewards.sum(dim=1)
    for component in range(rewards.shape[1]):
        batch[f"reward{component + 1}"] = rewards[:, component].clone()


def run_multi_turn_rollout(
    policy_generation: GenerationInterface,
    input_batch: BatchedDataDict[DatumSpec],
    tokenizer: Any,
    task_to_env: dict[str, EnvironmentInterface],
    max_seq_len: int,
    max_rollout_turns: int = 999999,
    greedy: bool = False,
) -> tuple[BatchedDataDict[DatumSpec], dict[str, Any]]:
    """Play the batch until every sample ends; return it and NeMo RL's rollout metrics.

    The returned batch is a copy of ``input_batch`` (its message logs are not touched) with
    the full ``message_log`` of each sample, ``total_reward`` (sum over turns), ``num_turns``,
    ``truncated`` (hit ``max_seq_len``), ``terminated`` (ended by its environment), and the
    environments' last ``extra_env_info`` and ``stop_strings``. An input ``sample_seeds``
    [B] seeds each sample's sampling, offset per turn, so a replayed episode draws the same
    tokens whatever the engine generated before.
    """
    batch = _copy_batch(input_batch)
    size = len(batch["message_log"])
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    if "stop_strings" not in batch:
        batch["stop_strings"] = [None] * size
    total_rewards: torch.Tensor | None = None  # [B], or [B, K] from a multi-reward environment
    turns = torch.zeros(size, dtype=torch.long)
    gen_tokens = torch.zeros(size, dtype=torch.long)
    env_tokens = torch.zeros(size, dtype=torch.long)
    truncated = torch.zeros(size, dtype=torch.bool)  # no room left: the episode ends
    hit_budget = torch.zeros(size, dtype=torch.bool)  # a turn's response hit max_new_tokens
    terminated = torch.zeros(size, dtype=torch.bool)
    turn_gen_lengths: list[int] = []
    env_time = generation_time = 0.0
    lengths = torch.tensor([_log_length(log) for log in batch["message_log"]], dtype=torch.long)
    truncated |= lengths >= max_seq_len
    active = torch.where(~truncated)[0]

    for turn in range(max_rollout_turns):
        if len(active) == 0:
            break
        active_batch = batch.select_indices(active)
        flat, input_lengths = batched_message_log_to_flat_message(
            [get_keys_from_message_log(log, ["token_ids"]) for log in active_batch["message_log"]],
            pad_value_dict={"token_ids": pad_id},
        )
        generation_input: BatchedDataDict[GenerationDatumSpec] = BatchedDataDict(
            {
                "input_ids": flat["token_ids"],
                "input_lengths": input_lengths,
                "stop_strings": active_batch["stop_strings"],
            }
        )
        if "sample_seeds" in active_batch:
            generation_input["sample_seeds"] = (active_batch["sample_seeds"] + turn * size) % 2**31
        start = time.perf_counter()
        active_batch, generated_ids, _ = generate_responses(
            policy_generation,
            generation_input,
            active_batch,
            tokenizer,
            input_lengths,
            greedy=greedy,
        )
        generation_time += time.perf_counter() - start
        for i, global_idx in enumerate(active.tolist()):
            room = max_seq_len - int(input_lengths[i])
            if len(generated_ids[i]) > room:  # the backend's budget ignores max_seq_len
                _cut_last_turn(active_batch["message_log"][i], room, tokenizer)
                generated_ids[i] = generated_ids[i][:room]
                truncated[global_idx] = True
            if "truncated" in active_batch and bool(active_batch["truncated"][i]):
                hit_budget[global_idx] = True  # the response hit its budget without a stop
            gen_tokens[global_idx] += len(generated_ids[i])
            turn_gen_lengths.append(len(generated_ids[i]))

        start = time.perf_counter()
        env_output = calculate_rewards(active_batch, task_to_env)
        env_time += time.perf_counter() - start
        if total_rewards is None:
            total_rewards = torch.zeros(size, *env_output.rewards.shape[1:])
        total_rewards[active] += env_output.rewards

        for i, global_idx in enumerate(active.tolist()):
            used = int(input_lengths[i]) + len(generated_ids[i])
            observation = env_output.observations[i]
            obs_ids = tokenizer(
                observation["content"], return_tensors="pt", add_special_tokens=False
            )["input_ids"][0]
            content = observation["content"]
            if used + len(obs_ids) >= max_seq_len:  # no room left to generate: the sample ends
                if used + len(obs_ids) > max_seq_len:
                    obs_ids = obs_ids[: max_seq_len - used]
                    content = tokenizer.decode(obs_ids)
                truncated[global_idx] = True
            batch["message_log"][global_idx].append(
                {"role": observation["role"], "content": content, "token_ids": obs_ids}
            )
            env_tokens[global_idx] += len(obs_ids)
            turns[global_idx] += 1
            terminated[global_idx] = bool(env_output.terminateds[i])
            batch["extra_env_info"][global_idx] = env_output.metadata[i]
            batch["stop_strings"][global_idx] = env_output.next_stop_strings[i]
        # the assistant turn was appended to active_batch's logs, which are the batch's logs
        done = truncated[active] | terminated[active]
        active = active[~done]

    store_rewards(batch, torch.zeros(size) if total_rewards is None else total_rewards)
    batch["num_turns"] = turns
    # Episodes still going when the turns ran out (neither ended by the env nor out of room).
    max_turns_reached = (turns >= max_rollout_turns) & ~terminated & ~truncated
    # As NeMo RL's: out of room, or a response cut by its token budget (the episode goes on).
    truncated |= hit_budget
    batch["truncated"] = truncated
    batch["terminated"] = terminated
    metrics = _rollout_metrics(
        turns, terminated, truncated, max_turns_reached, gen_tokens, env_tokens, turn_gen_lengths
    )
    metrics.update({"env_time_s": env_time, "generation_time_s": generation_time})
    return batch, metrics


def _copy_batch(input_batch: BatchedDataDict) -> BatchedDataDict:
    """A batch whose message logs and per-sample lists can grow without touching the input."""
    batch = type(input_batch)()
    for key, value in input_batch.items():
        if key == "message_log":
            batch[key] = [[dict(message) for message in log] for log in value]
        elif isinstance(value, list):
            batch[key] = [dict(v) if isinstance(v, dict) else v for v in value]
        else:
            batch[key] = value
    return batch


def _log_length(message_log: list[dict[str, Any]]) -> int:
    return sum(len(message["token_ids"]) for message in message_log)


def _cut_last_turn(message_log: list[dict[str, Any]], keep: int, tokenizer: Any) -> None:
    """Shorten the just-generated assistant turn to ``keep`` tokens (text re-decoded)."""
    message = message_log[-1]
    message["token_ids"] = message["token_ids"][:keep]
    if "generation_logprobs" in message:
        message["generation_logprobs"] = message["generation_logprobs"][:keep]
    message["content"] = tokenizer.decode(message["token_ids"], skip_special_tokens=True)


def _rollout_metrics(
    turns: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    max_turns_reached: torch.Tensor,
    gen_tokens: torch.Tensor,
    env_tokens: torch.Tensor,
    turn_gen_lengths: list[int],
) -> dict[str, Any]:
    size = max(len(turns), 1)
    gen_lengths = torch.tensor(turn_gen_lengths or [0], dtype=torch.float32)
    return {
        "total_turns": int(turns.sum()),
        "avg_turns_per_sample": turns.sum().item() / size,
        "max_turns_per_sample": int(turns.max()) if len(turns) else 0,
        "natural_termination_rate": terminated.sum().item() / size,
        "truncation_rate": truncated.sum().item() / size,
        "max_turns_reached_rate": max_turns_reached.sum().item() / size,
        "mean_generation_length": gen_lengths.mean().item(),
        "max_generation_length": int(gen_lengths.max()),
        "mean_gen_tokens_per_sample": gen_tokens.sum().item() / size,
        "mean_env_tokens_per_sample": env_tokens.sum().item() / size,
        "mean_total_tokens_per_sample": (gen_tokens + env_tokens).sum().item() / size,
    }
