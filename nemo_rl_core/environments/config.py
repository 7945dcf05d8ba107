"""The ``env.<name>`` sections of the built-in environments, apart from the environments
themselves (each environment module re-exports its own): the config check validates a
run's ``env:`` without importing torch or starting any checker.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_rl_core.environments.code_sandbox import SandboxLimits
from nemo_rl_core.utils.key_support import Only, inert


class MathEnvConfig(BaseModel):
    """``env.math`` keys."""

    model_config = ConfigDict(extra="forbid")

    num_workers: int = Field(8, ge=1)
    stop_strings: list[str] | None = None
    # None: "math" (NeMo RL's default); english_multichoice: "Answer: <letter>";
    # multilingual_multichoice: "Answer:" in one of NeMo RL's evaluation languages, the
    # letter A-D in Latin, Arabic, Bengali or full-width script (``choice_answers``).
    verifier_type: (
        Literal["math", "countdown", "english_multichoice", "multilingual_multichoice"] | None
    ) = "math"
    # The check of verifier_type "math": math-verify's symbolic one (None: the same), or
    # DAPO's string match of the "Answer: ..." line (``dapo_math_verifier``).
    math_verify_impl: Literal["hf_math_verify", "dapo_math_verify"] | None = "hf_math_verify"
    timeout_seconds: float = Field(10.0, gt=0, description="per-sample checking time limit")


class MathMultiRewardEnvConfig(MathEnvConfig):
    """``env.math_multi_reward`` keys: the math environment's, with its one checker (three
    rewards of a ``<think>...</think>\n<answer>...</answer>`` response)."""

    verifier_type: Literal["math"] | None = "math"
    math_verify_impl: Literal["hf_math_verify"] | None = "hf_math_verify"


class CodeEnvConfig(BaseModel):
    """``env.code`` keys."""

    model_config = ConfigDict(extra="forbid")

    num_workers: int = Field(4, ge=1, description="sandboxes run at once")
    stop_strings: list[str] | None = None
    wall_time_limit_s: float = Field(10.0, gt=0)
    cpu_time_limit_s: int = Field(5, ge=1)
    memory_limit_mb: int = Field(512, ge=64)
    output_limit_bytes: int = Field(1 << 20, ge=1024)
    max_processes: int = Field(16, ge=1)

    def limits(self) -> SandboxLimits:
        return SandboxLimits(
            wall_time_s=self.wall_time_limit_s,
            cpu_time_s=self.cpu_time_limit_s,
            memory_mb=self.memory_limit_mb,
            output_bytes=self.output_limit_bytes,
            max_processes=self.max_processes,
        )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RewardModelTokenizerConfig(_Strict):
    name: str | None = None


class RewardModelTypeConfig(_Strict):
    enabled: bool = True
    reward_model_type: Literal["bradley_terry"] = "bradley_terry"


class RewardModelEnvConfig(_Strict):
    """``env.reward_model`` keys."""

    enabled: bool = True
    model_name: str
    tokenizer: RewardModelTokenizerConfig = RewardModelTokenizerConfig()
    precision: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_size: int = Field(32, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    reward_model_cfg: RewardModelTypeConfig = RewardModelTypeConfig()
    resources: dict[str, Any] | None = None
    dtensor_cfg: dict[str, Any] | None = None
    dynamic_batching: dict[str, Any] | None = None
    sequence_packing: dict[str, Any] | None = None
    # NeMo RL builds the scorer as a Policy from this section, so its YAML carries policy
    # keys that scoring never uses: no optimizer (init_optimizer=False), no training.
    checkpoint_path: Annotated[
        str | None,
        Only(
            None,
            reason="NeMo RL loads the scorer's weights from this policy checkpoint; here the "
            "reward model loads from model_name (a Hugging Face folder)",
        ),
    ] = None
    offload_optimizer_for_logprob: Annotated[
        bool, inert("the scorer has no optimizer to offload (NeMo RL builds it without one)")
    ] = False
    max_grad_norm: Annotated[None, inert("NeMo RL asserts it is null: the scorer never trains")] = (
        None
    )
    processor: Annotated[
        str | None,
        inert("NeMo RL v0.7 reads it nowhere: the scorer reads the rollout's messages"),
    ] = None


class SlidingPuzzleConfig(BaseModel):
    """``env.sliding_puzzle_game.cfg.game_config`` keys."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(3, ge=2, le=8)
    shuffle_moves: int = Field(10, ge=0)


class SlidingPuzzleEnvConfig(BaseModel):
    """``env.sliding_puzzle_game.cfg`` keys."""

    model_config = ConfigDict(extra="forbid")

    game_config: SlidingPuzzleConfig = SlidingPuzzleConfig()
    max_moves: int = Field(50, ge=1)
