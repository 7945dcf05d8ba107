"""The work of each stage: read the stored inputs, call the core library, return outputs.

Each function is what a declaration (:mod:`nemo_rl_core.pipeline.algorithms`) names as a
stage's ``compute``; it holds no orchestration and no algorithm branches: where GRPO and
PPO differ, they declare different functions. Each name says whose stage it is: ``grpo_``,
``ppo_``, ``sft_``, ``dpo_``, ``rm_``, ``distillation_``, ``eval_``; ``rollout_`` stages are
shared by the algorithms that generate (GRPO and PPO all of them, distillation its prompts,
generation and validation), ``preference_`` ones by DPO and RM, and every trainer retains
its checkpoints with ``retain_checkpoints``.
"""

import time
from typing import Any

from nemo_rl_core.algorithms import (
    distillation,
    dpo,
    grpo,
    ppo,
    prompt_batches,
    rm,
    rollout_generation,
    scoring,
    sft,
    training,
    validation,
)
from nemo_rl_core.algorithms.loss import DPOLossFn, NLLLossFn, PreferenceLossFn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.evals import eval as evaluation
from nemo_rl_core.models.generation.engine_load import ENGINE_LOAD_METRICS
from nemo_rl_core.pipeline.context import PREVIOUS, StageContext, StageResult
from nemo_rl_core.pipeline.spec import shard_bounds


def rollout_validation(ctx: StageContext) -> StageResult:
    """Accuracy, pass@k and greedy accuracy of the weights this iteration starts from, on the
    held-out prompts; every sample's result is kept."""
    rt = ctx.runtime
    with rt.generation(ctx.iteration) as engine:
        results, metrics = validation.validate_batches(
            engine,
            rt.validation_batches(),
            rt.tokenizer,
            rt.task_to_env,
            ctx.config,
            ctx.iteration,
        )
    return StageResult({"batch": results, "metrics": metrics}, metrics)


def rollout_prompts(ctx: StageContext) -> StageResult:
    """The dataloader's next batch, each prompt repeated per generation (a refill round
    continues where its previous round left the dataloader)."""
    if PREVIOUS in ctx.upstream:
        start = ctx.json(PREVIOUS, "dataloader_state")
    else:
        start = ctx.runtime.dataloader_state(ctx.iteration)
    first = ctx.round_index * prompt_batches.prompts_per_batch(ctx.config.algorithm)
    batch, state = prompt_batches.take_prompts(ctx.runtime.dataloader, ctx.config, start, first)
    return StageResult({"batch": batch, "dataloader_state": state}, {"num_samples": batch.size})


def rollout_generate(ctx: StageContext) -> StageResult:
    """Responses (multi-turn tasks: whole episodes) from the engine at this iteration's
    weights, or under async GRPO at the weights ``max_trajectory_age_steps`` older. Unsplit
    (one-turn rollouts): one shard, merged; multi-turn episodes are played whole."""
    if ctx.config.algorithm.max_rollout_turns == 1:
        rollouts, metrics = _generate_slice(ctx, 0, 1)
        merged = rollout_generate_merge(ctx, [rollouts])
        # The engine's load (vllm_cfg.enable_vllm_metrics_logger) is the unsplit stage's too.
        load = {name: metrics[name] for name in ENGINE_LOAD_METRICS if name in metrics}
        return StageResult(merged.outputs, {**load, **merged.metrics})
    rt = ctx.runtime
    with rt.generation(ctx.weights_step) as engine:
        rollouts, metrics = rollout_generation.generate_rollouts(
            engine,
            ctx.batch("prompts"),
            rt.tokenizer,
            rt.task_to_env,
            ctx.config,
            ctx.iteration,
            ctx.round_index,
        )
    return StageResult({"batch": rollouts}, {**metrics, "weights_step": ctx.weights_step})


def rollout_generate_shard(ctx: StageContext, index: int, count: int) -> BatchedDataDict:
    """One-turn responses of one slice of the prompts, each sampled with its own seed; the
    slice holds whole batches of what the engine generates together (``generation_unit``)."""
    return _generate_slice(ctx, index, count)[0]


def _generate_slice(
    ctx: StageContext, index: int, count: int
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """One slice's responses and the metrics of generating them."""
    rt = ctx.runtime
    prompts = ctx.batch("prompts")
    rows = shard_bounds(prompts.size, index, count, generation_unit(ctx.config, prompts.size))
    with rt.generation(ctx.weights_step) as engine:
        return rollout_generation.generate_rollouts(
            engine,
            prompts,
            rt.tokenizer,
            rt.task_to_env,
            ctx.config,
            ctx.iteration,
            ctx.round_index,
            rows=rows,
        )


def rollout_generate_merge(ctx: StageContext, shards: list[BatchedDataDict]) -> StageResult:
    """The slices' responses joined in order, with the batch's generation metrics."""
    rollouts: BatchedDataDict[Any] = BatchedDataDict.from_batches(shards)
    metrics = rollout_generation.one_turn_metrics(rollouts)
    return StageResult({"batch": rollouts}, {**metrics, "weights_step": ctx.weights_step})


def generation_unit(config: Any, size: int) -> int:
    """How many samples the engine generates together, which a shard must hold whole for its
    output to be the unsplit one's bit for bit: vLLM seeds and computes each request on its
    own (1); transformers' ``generate`` computes a batch together, and generates
    ``policy.generation_batch_size`` at a time (all ``size`` when unset)."""
    if config.policy.generation.backend != "hf":
        return 1
    return config.policy.generation_batch_size or size


def rollout_samples(config: Any) -> int:
    """Samples per generation batch (a refill round's too)."""
    prompts = prompt_batches.prompts_per_batch(config.algorithm)
    return prompts * config.algorithm.num_generations_per_prompt


def rollout_generate_widest(config: Any) -> tuple[int, str]:
    samples = rollout_samples(config)
    if config.algorithm.max_rollout_turns > 1:
        return 1, (
            f"multi-turn episodes (max_rollout_turns={config.algorithm.max_rollout_turns}) "
            "are played over the whole batch"
        )
    unit = generation_unit(config, samples)
    if unit == samples and config.policy.generation_batch_size is None and samples > 1:
        return 1, (
            f"transformers generates its {samples} samples as one batch; set "
            "policy.generation_batch_size (a shard holds whole batches of it)"
        )
    return -(-samples // unit), f"{samples} samples, generated {unit} at a time"


def rollout_reward_widest(config: Any) -> tuple[int, str]:
    samples = rollout_samples(config)
    return samples, f"{samples} samples"


def rollout_reward(ctx: StageContext) -> StageResult:
    """The environments score each rollout; the rewards are scaled and shaped, truncated
    responses filtered, and under dynamic sampling the informative groups kept (with
    those of earlier rounds) until a step's batch is complete. Unsplit: one shard, merged."""
    return rollout_reward_merge(ctx, [rollout_reward_shard(ctx, 0, 1)])


def rollout_reward_shard(ctx: StageContext, index: int, count: int) -> BatchedDataDict:
    """The environments' rewards of one slice of the rollouts."""
    rollouts = ctx.batch("generate")
    rows = shard_bounds(rollouts.size, index, count)
    return scoring.score_samples(rollouts.slice(*rows), ctx.runtime.task_to_env, ctx.config)


def rollout_reward_merge(ctx: StageContext, shards: list[BatchedDataDict]) -> StageResult:
    """The scored slices joined in order; then what needs the whole batch: the metrics,
    scaling and shaping, filtering, dynamic sampling's selection."""
    config = ctx.config
    scored: BatchedDataDict[Any] = BatchedDataDict.from_batches(shards)
    metrics = scoring.reward_metrics(scored, config)
    scored, processing = grpo.process_rewards(scored, config)
    metrics |= processing
    if not config.algorithm.use_dynamic_sampling:
        return StageResult({"batch": scored}, metrics)
    kept_before = ctx.batch(PREVIOUS) if PREVIOUS in ctx.upstream else None
    selected, complete, selection = grpo.select_prompt_groups(
        scored, kept_before, config, ctx.round_index
    )
    return StageResult(
        {"batch": selected, "selection": {"complete": complete}}, metrics | selection
    )


def rollout_logprob(ctx: StageContext) -> StageResult:
    """The policy's and the reference policy's logprobs of the rollouts. Unsplit: one shard,
    merged (the training inputs made once, not once per side)."""
    train_data = _logprob_inputs(ctx)
    return _with_logprobs(train_data, [_shard_logprobs(ctx, train_data, 0, 1)])


def rollout_logprob_shard(ctx: StageContext, index: int, count: int) -> BatchedDataDict:
    """The logprobs of one slice of the rollouts' training inputs, padded as the whole
    batch's, in whole microbatches (``policy.logprob_batch_size``): the forward passes are
    the unsplit stage's."""
    return _shard_logprobs(ctx, _logprob_inputs(ctx), index, count)


def rollout_logprob_merge(ctx: StageContext, shards: list[BatchedDataDict]) -> StageResult:
    """The rollouts' training inputs with the slices' logprobs joined in order."""
    return _with_logprobs(_logprob_inputs(ctx), shards)


def _logprob_inputs(ctx: StageContext) -> BatchedDataDict:
    return grpo.logprob_inputs(ctx.batch("reward"), ctx.runtime.tokenizer, ctx.config)


def _shard_logprobs(
    ctx: StageContext, train_data: BatchedDataDict, index: int, count: int
) -> BatchedDataDict:
    unit = ctx.config.policy.logprob_batch_size or train_data.size
    rows = shard_bounds(train_data.size, index, count, unit)
    with ctx.runtime.policy_in_use(ctx.iteration) as policy:
        return grpo.policy_logprobs(policy, train_data.slice(*rows), ctx.config)


def _with_logprobs(train_data: BatchedDataDict, shards: list[BatchedDataDict]) -> StageResult:
    train_data.update(BatchedDataDict.from_batches(shards))
    return StageResult({"batch": train_data})


def rollout_logprob_widest(config: Any) -> tuple[int, str]:
    samples = config.algorithm.num_prompts_per_step * config.algorithm.num_generations_per_prompt
    policy = config.policy
    if policy.dynamic_batching.enabled or policy.sequence_packing.enabled:
        return 1, (
            "policy.dynamic_batching / sequence_packing plans the microbatches over the whole batch"
        )
    unit = policy.logprob_batch_size or samples
    return -(-samples // unit), (
        f"{samples} samples in microbatches of policy.logprob_batch_size={unit}"
    )


def ppo_value(ctx: StageContext) -> StageResult:
    """The value model's estimates V_t of every rollout token (PPO)."""
    with_values = ppo.compute_values(ctx.runtime.value(ctx.iteration), ctx.batch("logprob"))
    return StageResult({"batch": with_values})


def grpo_advantage(ctx: StageContext) -> StageResult:
    """Per-prompt baselines and each token's advantage (GRPO, GDPO, Reinforce++)."""
    with_advantages, metrics = grpo.compute_advantages(ctx.batch("logprob"), ctx.config)
    return StageResult({"batch": with_advantages}, metrics)


def ppo_advantage(ctx: StageContext) -> StageResult:
    """GAE advantages and value targets from the value model's estimates (PPO)."""
    with_advantages, metrics = ppo.compute_advantages(ctx.batch("value"), ctx.config)
    return StageResult({"batch": with_advantages}, metrics)


def grpo_train(ctx: StageContext) -> StageResult:
    """One policy update, committed as the checkpoint the next iteration starts from."""
    rt, step = ctx.runtime, ctx.iteration
    policy = rt.policy_for_update(step)
    started = time.perf_counter()
    metrics = training.train_policy(
        policy, ctx.batch("advantage"), grpo.build_loss_fn(ctx.config), ctx.config, step
    )
    # The stage's own seconds also hold the checkpoint commit: keep the two apart.
    metrics["policy_update_seconds"] = time.perf_counter() - started
    return _committed(ctx, {"policy": policy}, metrics)


def ppo_train(ctx: StageContext) -> StageResult:
    """The policy update and the value model's update toward the GAE returns (PPO), both in
    one checkpoint."""
    rt, step = ctx.runtime, ctx.iteration
    policy, value_model = rt.policy_for_update(step), rt.value_for_update(step)
    started = time.perf_counter()
    metrics = ppo.update_policy_and_value(
        policy,
        value_model,
        ctx.batch("advantage"),
        grpo.build_loss_fn(ctx.config),
        ctx.config,
        step,
    )
    metrics["policy_update_seconds"] = time.perf_counter() - started
    return _committed(ctx, {"policy": policy, "value": value_model}, metrics)


def sft_validation(ctx: StageContext) -> StageResult:
    """SFT's ``val_loss`` of the weights this iteration starts from, on the held-out
    conversations (eval mode: no update)."""
    rt = ctx.runtime
    batches = sft.validation_batches(ctx.config, rt.tokenizer)
    metrics = sft.validation_loss(rt.policy(ctx.iteration), batches, NLLLossFn(), ctx.config)
    return StageResult({"metrics": metrics}, metrics)


def sft_batch(ctx: StageContext) -> StageResult:
    """The step's global batch of conversations as training data (stored, so a rerun of
    ``train`` trains on the same tensors), and where the dataloader stands after it."""
    start = ctx.runtime.dataloader_state(ctx.iteration)
    batch, state = sft.take_batch(ctx.runtime.dataloader, ctx.config, ctx.runtime.tokenizer, start)
    return StageResult({"batch": batch, "dataloader_state": state}, {"num_samples": batch.size})


def sft_train(ctx: StageContext) -> StageResult:
    """One optimizer step of NeMo RL's NLL loss on the stored batch, committed as the
    checkpoint the next iteration starts from."""
    step = ctx.iteration
    policy = ctx.runtime.policy_for_update(step)
    metrics = training.train_policy(policy, ctx.batch("batch"), NLLLossFn(), ctx.config, step)
    return _committed(ctx, {"policy": policy}, metrics, data_stage="batch")


def _committed(
    ctx: StageContext, models: dict, metrics: dict, data_stage: str = "prompts"
) -> StageResult:
    dataloader_state = ctx.json(data_stage, "dataloader_state")
    url = ctx.runtime.commit_checkpoint(ctx.iteration + 1, models, dataloader_state, metrics)
    return StageResult({"metrics": {**metrics, "checkpoint": url}}, metrics)


def retain_checkpoints(ctx: StageContext) -> StageResult:
    """Which committed checkpoints stay (``save_period``, ``keep_top_k``, ``metric_name``):
    the committing stage wrote the new one; this decides about the older ones. Validation
    metrics of this iteration's weights join their checkpoint's training info first, as
    ``val:<name>``, so that ``metric_name: val:accuracy`` ranks by them. Under async GRPO
    the checkpoints that rollouts still in flight generate from stay too. With
    ``checkpointing.enabled: false`` only those stay (the newest: what a continued run
    starts from)."""
    storage = ctx.runtime.storage
    if "validate" in ctx.upstream and ctx.iteration > 0:
        validation = ctx.json("validate", "metrics")
        storage.record_checkpoint_metrics(
            ctx.iteration, {f"val:{name}": value for name, value in validation.items()}
        )
    retention = ctx.runtime.prune_checkpoints()
    # In the manifest entry, not an object of its own: nothing reads it but an operator,
    # and on S3 each object is a request more per iteration.
    return StageResult(
        {},
        {
            "checkpoints_kept": len(retention.kept),
            "kept": retention.kept,
            "deleted": retention.deleted,
        },
    )


def eval_prompts(ctx: StageContext) -> StageResult:
    """Every eval prompt, ``eval.num_tests_per_prompt`` times, templated by the evaluated
    model's tokenizer."""
    dataset = evaluation.build_eval_dataset(ctx.config.data, ctx.runtime.tokenizer)
    batch = evaluation.eval_prompts(dataset, ctx.config.eval)
    return StageResult({"batch": batch}, {"num_samples": batch.size})


def eval_generate(ctx: StageContext) -> StageResult:
    """The evaluated weights' answers (``generation.model_name``), seeded per sample."""
    rt = ctx.runtime
    with rt.generation(ctx.iteration) as engine:
        answered, metrics = evaluation.generate_answers(
            engine, ctx.batch("prompts"), rt.tokenizer, ctx.config
        )
    return StageResult({"batch": answered}, metrics)


def eval_reward(ctx: StageContext) -> StageResult:
    """Each answer's reward from the environment of its task."""
    scored, metrics = evaluation.score_answers(ctx.batch("generate"), ctx.runtime.task_to_env)
    return StageResult({"batch": scored}, metrics)


def eval_score(ctx: StageContext) -> StageResult:
    """pass@k, avg@n and (``metric: cons@k``) cons@k of the scored answers."""
    scored = ctx.batch("reward")
    scores = evaluation.eval_metrics(
        scored["total_reward"], ctx.config.eval, evaluation.extracted_answers(scored)
    )
    return StageResult({"scores": scores}, scores)


def distillation_reward(ctx: StageContext) -> StageResult:
    """The environments score each rollout, for the metrics only (on-policy distillation
    trains on the teacher's logits, not on rewards). Unsplit: one shard, merged."""
    return distillation_reward_merge(ctx, [rollout_reward_shard(ctx, 0, 1)])


def distillation_reward_merge(ctx: StageContext, shards: list[BatchedDataDict]) -> StageResult:
    """The scored slices joined in order, with their reward metrics."""
    scored: BatchedDataDict[Any] = BatchedDataDict.from_batches(shards)
    return StageResult({"batch": scored}, scoring.reward_metrics(scored, ctx.config))


def distillation_teacher(ctx: StageContext) -> StageResult:
    """The teacher's top-k logits on the student's rollouts (``distillation.topk_logits_k``),
    stored with the training inputs the student trains on."""
    rt = ctx.runtime
    train_data = distillation.rollouts_to_train_data(ctx.batch("reward"), rt.tokenizer, ctx.config)
    with_teacher = distillation.teacher_topk_logits(rt.teacher(), train_data, ctx.config)
    return StageResult({"batch": with_teacher})


def distillation_train(ctx: StageContext) -> StageResult:
    """One optimizer step of the student toward the teacher (``DistillationLossFn``: the
    ``loss_fn.kl_type`` KL on the teacher's top-k), committed as the next iteration's
    checkpoint."""
    step = ctx.iteration
    policy = ctx.runtime.policy_for_update(step)
    loss_fn = distillation.build_loss_fn(ctx.config)
    metrics = training.train_policy(policy, ctx.batch("teacher"), loss_fn, ctx.config, step)
    return _committed(ctx, {"policy": policy}, metrics)


def dpo_validation(ctx: StageContext) -> StageResult:
    """DPO's validation of the weights this iteration starts from on each validation set's
    held-out pairs (eval mode: no update): loss, preference accuracy, chosen and rejected
    rewards, per set as ``validation-<set>_<metric>``."""
    rt, config = ctx.runtime, ctx.config
    metrics = dpo.validation_metrics(
        rt.policy(ctx.iteration),
        dpo.validation_batches(config, rt.tokenizer),
        DPOLossFn(config.algorithm),
        config,
    )
    return StageResult({"metrics": metrics}, metrics)


def preference_batch(ctx: StageContext) -> StageResult:
    """The step's global batch of preference pairs (chosen and rejected interleaved), stored,
    and where the dataloader stands after it."""
    start = ctx.runtime.dataloader_state(ctx.iteration)
    batch, state = dpo.take_batch(ctx.runtime.dataloader, start)
    return StageResult({"batch": batch, "dataloader_state": state}, {"num_samples": batch.size})


def dpo_reference(ctx: StageContext) -> StageResult:
    """The frozen reference policy's logprobs of the stored pairs: stored, so a rerun of
    ``train`` reads the same tensors."""
    rt = ctx.runtime
    mbs = 2 * ctx.config.policy.train_micro_batch_size
    batch = dpo.with_reference_logprobs(rt.reference_policy(), ctx.batch("batch"), mbs)
    return StageResult({"batch": batch})


def dpo_train(ctx: StageContext) -> StageResult:
    """One optimizer step of NeMo RL's DPO loss on the stored pairs (a pair's two sequences
    in the same microbatch), committed as the checkpoint the next iteration starts from."""
    return _preference_step(ctx, ctx.batch("reference"), DPOLossFn(ctx.config.algorithm))


def rm_validation(ctx: StageContext) -> StageResult:
    """The reward model's Bradley-Terry loss, accuracy and rewards on each validation set's
    held-out pairs, at the weights this iteration starts from (eval mode: no update)."""
    rt, config = ctx.runtime, ctx.config
    sets = dpo.validation_batches(config, rt.tokenizer)
    metrics = rm.reward_validation(rt.policy(ctx.iteration), sets, PreferenceLossFn(), config)
    return StageResult({"metrics": metrics}, metrics)


def rm_train(ctx: StageContext) -> StageResult:
    """One optimizer step of the Bradley-Terry loss (``PreferenceLossFn``) on the stored
    pairs, committed as the checkpoint the next iteration starts from."""
    return _preference_step(ctx, ctx.batch("batch"), PreferenceLossFn())


def _preference_step(ctx: StageContext, batch: BatchedDataDict, loss_fn: Any) -> StageResult:
    """One optimizer step on all the pairs, each pair's two sequences in one microbatch
    (NeMo RL doubles gbs and mbs), committed; a batch with no pair short enough to train
    on fails the stage, naming the key to change."""
    step, config = ctx.iteration, ctx.config
    dpo.require_pairs_to_train(batch, config, step)
    policy = ctx.runtime.policy_for_update(step)
    mbs = 2 * config.policy.train_micro_batch_size
    metrics = training.train_policy(policy, batch, loss_fn, config, step, gbs=batch.size, mbs=mbs)
    return _committed(ctx, {"policy": policy}, metrics, data_stage="batch")
