"""The algorithms, each declared once. Read a declaration as the iteration's diagram: each
stage in order, what it reads, and the core function it calls.

    GRPO: [validate] -> prompts -> generate -> reward -> logprob -> advantage -> train
          -> checkpoint
    PPO:  [validate] -> prompts -> generate -> reward -> logprob -> value -> advantage (GAE)
          -> train (policy and value) -> checkpoint
    SFT:  [validate (loss)] -> batch -> train (NLL) -> checkpoint
    distillation: [validate] -> prompts -> generate -> reward (metrics only) -> teacher
          (top-k logits) -> train (KL to the teacher) -> checkpoint
    DPO:  [validate (loss, preference accuracy)] -> batch -> reference (the reference
          policy's logprobs) -> train (DPO loss) -> checkpoint
    RM:   [validate (loss, preference accuracy)] -> batch -> train (Bradley-Terry)
          -> checkpoint
    eval: prompts -> generate -> reward -> score   (one iteration; it trains nothing)

``validate`` runs when NeMo RL's schedule says (``val_period``, ``val_at_start``,
``val_at_end``) on the weights the iteration starts from; an iteration past the last
training step may hold only it (``val_at_end``) and the checkpoint bookkeeping.
"""

from typing import Any

from nemo_rl_core.algorithms import distillation, dpo, grpo_config, prompt_batches, sft
from nemo_rl_core.algorithms.config import PREFERENCE_VALIDATION_PREFIX
from nemo_rl_core.algorithms.distillation_config import DistillationMasterConfig
from nemo_rl_core.algorithms.dpo_config import DPOMasterConfig
from nemo_rl_core.algorithms.grpo_config import MasterConfig
from nemo_rl_core.algorithms.ppo_config import PPOMasterConfig
from nemo_rl_core.algorithms.rm_config import RMMasterConfig
from nemo_rl_core.algorithms.schedule import async_depth, validation_due
from nemo_rl_core.algorithms.sft_config import SFTMasterConfig
from nemo_rl_core.evals.config import EvalMasterConfig
from nemo_rl_core.pipeline import stages
from nemo_rl_core.pipeline.spec import (
    FanOut,
    Pipeline,
    Refill,
    RunAhead,
    Stage,
    register_pipeline,
)


def validation_is_due(config: Any, iteration: int, final_step: int) -> bool:
    return validation_due(config.algorithm, iteration, final_step)


VALIDATE = Stage(
    "validate",
    stages.rollout_validation,
    versions=("policy",),
    reported=("accuracy", "greedy_accuracy"),
    due=validation_is_due,
)
ROLLOUT = (
    Stage("prompts", stages.rollout_prompts, versions=("dataloader",)),
    Stage(
        "generate",
        stages.rollout_generate,
        reads=("prompts",),
        versions=("policy",),
        reported=("mean_gen_tokens_per_sample",),
        fan_out=FanOut(
            stages.rollout_generate_shard,
            stages.rollout_generate_merge,
            stages.rollout_generate_widest,
        ),
    ),
    Stage(
        "reward",
        stages.rollout_reward,
        reads=("generate",),
        reported=("mean_reward", "mean_total_reward"),
        fan_out=FanOut(
            stages.rollout_reward_shard, stages.rollout_reward_merge, stages.rollout_reward_widest
        ),
    ),
    Stage(
        "logprob",
        stages.rollout_logprob,
        reads=("reward",),
        versions=("policy",),
        fan_out=FanOut(
            stages.rollout_logprob_shard,
            stages.rollout_logprob_merge,
            stages.rollout_logprob_widest,
        ),
    ),
)
POLICY_METRICS = ("loss", "kl_penalty", "probs_ratio_clamped_fraction", "grad_norm")
# DAPO's dynamic sampling: generate and score more prompts until a step's batch is full.
DYNAMIC_SAMPLING = Refill(
    stages=("prompts", "generate", "reward"),
    enabled=lambda config: config.algorithm.use_dynamic_sampling,
)
# Asynchronous GRPO (grpo.async_grpo): the rollouts of the next max_trajectory_age_steps
# iterations run while this one trains, generated from weights that many steps old; the
# loss's importance-sampling correction weighs each token by pi_old / pi_gen.
ASYNC_ROLLOUTS = RunAhead(
    stages=("prompts", "generate", "reward"),
    lagged=("generate",),
    depth=lambda config: async_depth(config.algorithm),
)
RETENTION = Stage(
    "checkpoint",
    stages.retain_checkpoints,
    optional_reads=("train", "validate"),
    due=lambda config, iteration, final: (
        iteration < final or validation_is_due(config, iteration, final)
    ),
)

GRPO = register_pipeline(
    Pipeline(
        name="grpo",
        config_class=MasterConfig,
        default_config="examples/configs/grpo_math_tiny.yaml",
        identity_keys=("policy.model_name", "data", "grpo.seed"),
        refill=DYNAMIC_SAMPLING,
        run_ahead=ASYNC_ROLLOUTS,
        dataloader=prompt_batches.make_dataloader,
        data_setup=grpo_config.data_setup,
        stages=(
            VALIDATE,
            *ROLLOUT,
            Stage("advantage", stages.grpo_advantage, reads=("logprob",)),
            Stage(
                "train",
                stages.grpo_train,
                reads=("advantage", "prompts"),
                versions=("policy",),
                reported=POLICY_METRICS,
                commits=True,
            ),
            RETENTION,
        ),
    )
)

PPO = register_pipeline(
    Pipeline(
        name="ppo",
        config_class=PPOMasterConfig,
        default_config="examples/configs/ppo_tiny.yaml",
        identity_keys=("policy.model_name", "value.model_name", "data", "ppo.seed"),
        refill=DYNAMIC_SAMPLING,
        dataloader=prompt_batches.make_dataloader,
        data_setup=grpo_config.data_setup,
        stages=(
            VALIDATE,
            *ROLLOUT,
            Stage("value", stages.ppo_value, reads=("logprob",), versions=("value",)),
            Stage("advantage", stages.ppo_advantage, reads=("value",)),
            Stage(
                "train",
                stages.ppo_train,
                reads=("advantage", "prompts"),
                versions=("policy", "value"),
                reported=(*POLICY_METRICS, "value_loss"),
                commits=True,
            ),
            RETENTION,
        ),
    )
)

SFT = register_pipeline(
    Pipeline(
        name="sft",
        config_class=SFTMasterConfig,
        default_config="examples/configs/sft_tiny.yaml",
        identity_keys=("policy.model_name", "data", "sft.seed"),
        dataloader=sft.make_dataloader,
        data_setup=sft.data_setup,
        reference_policy=False,
        stages=(
            Stage(
                "validate",
                stages.sft_validation,
                versions=("policy",),
                reported=("val_loss",),
                due=validation_is_due,
            ),
            Stage("batch", stages.sft_batch, versions=("dataloader",)),
            Stage(
                "train",
                stages.sft_train,
                reads=("batch",),
                versions=("policy",),
                reported=("loss", "grad_norm"),
                commits=True,
            ),
            RETENTION,
        ),
    )
)

EVAL = register_pipeline(
    Pipeline(
        name="eval",
        config_class=EvalMasterConfig,
        default_config="examples/configs/eval_addition_tiny.yaml",
        identity_keys=("generation.model_name", "data"),
        stages=(
            Stage("prompts", stages.eval_prompts),
            Stage(
                "generate",
                stages.eval_generate,
                reads=("prompts",),
                versions=("policy",),
                reported=("mean_gen_tokens_per_sample",),
            ),
            Stage("reward", stages.eval_reward, reads=("generate",), reported=("mean_reward",)),
            Stage("score", stages.eval_score, reads=("reward",)),
        ),
    )
)

PREFERENCE_VALIDATION = (
    f"{PREFERENCE_VALIDATION_PREFIX}loss",
    f"{PREFERENCE_VALIDATION_PREFIX}accuracy",
)

DPO = register_pipeline(
    Pipeline(
        name="dpo",
        config_class=DPOMasterConfig,
        default_config="examples/configs/dpo_tiny.yaml",
        identity_keys=("policy.model_name", "data", "dpo.seed"),
        dataloader=dpo.make_dataloader,
        data_setup=dpo.data_setup,
        stages=(
            Stage(
                "validate",
                stages.dpo_validation,
                versions=("policy",),
                reported=PREFERENCE_VALIDATION,
                due=validation_is_due,
            ),
            Stage("batch", stages.preference_batch, versions=("dataloader",)),
            Stage("reference", stages.dpo_reference, reads=("batch",)),
            Stage(
                "train",
                stages.dpo_train,
                reads=("reference", "batch"),
                versions=("policy",),
                reported=("loss", "accuracy", "grad_norm"),
                commits=True,
            ),
            RETENTION,
        ),
    )
)

RM = register_pipeline(
    Pipeline(
        name="rm",
        config_class=RMMasterConfig,
        default_config="examples/configs/rm_tiny.yaml",
        identity_keys=("policy.model_name", "data", "rm.seed"),
        dataloader=dpo.make_dataloader,
        data_setup=dpo.data_setup,
        reference_policy=False,
        stages=(
            Stage(
                "validate",
                stages.rm_validation,
                versions=("policy",),
                reported=PREFERENCE_VALIDATION,
                due=validation_is_due,
            ),
            Stage("batch", stages.preference_batch, versions=("dataloader",)),
            Stage(
                "train",
                stages.rm_train,
                reads=("batch",),
                versions=("policy",),
                reported=("loss", "accuracy", "grad_norm"),
                commits=True,
            ),
            RETENTION,
        ),
    )
)

DISTILLATION = register_pipeline(
    Pipeline(
        name="distillation",
        config_class=DistillationMasterConfig,
        default_config="examples/configs/distillation_tiny.yaml",
        identity_keys=("policy.model_name", "teacher.model_name", "data", "distillation.seed"),
        dataloader=prompt_batches.make_dataloader,
        data_setup=grpo_config.data_setup,
        reference_policy=False,
        preflight=distillation.check_teacher_fits,
        stages=(
            VALIDATE,
            *ROLLOUT[:2],
            Stage(
                "reward",
                stages.distillation_reward,
                reads=("generate",),
                reported=("mean_reward",),
                fan_out=FanOut(
                    stages.rollout_reward_shard,
                    stages.distillation_reward_merge,
                    stages.rollout_reward_widest,
                ),
            ),
            Stage(
                "teacher",
                stages.distillation_teacher,
                reads=("reward",),
                sharded=distillation.teacher_is_sharded,
            ),
            Stage(
                "train",
                stages.distillation_train,
                reads=("teacher", "prompts"),
                versions=("policy",),
                reported=("loss", "grad_norm"),
                commits=True,
            ),
            RETENTION,
        ),
    )
)
