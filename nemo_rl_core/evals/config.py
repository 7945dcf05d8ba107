"""The YAML of an evaluation run: NeMo RL v0.7's ``run_eval`` keys (``eval:``, ``generation:``,
``tokenizer:``, ``data:``, ``env:``, ``cluster:``), validated into typed sections whose every
key carries its rule (:mod:`nemo_rl_core.utils.key_support`).

``generation.model_name`` names the weights to score: a built-in model or any HF-layout
directory, such as a run's ``checkpoints/step_000004``.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.config.cluster import ClusterConfig
from nemo_rl_core.config.orchestration import OrchestrationConfig
from nemo_rl_core.data.config import BUILTIN_DATASETS, input_file
from nemo_rl_core.data.datasets.builder import SPLITS
from nemo_rl_core.data.datasets.local_files import FILE_FORMATS
from nemo_rl_core.environments.utils import (
    ENVIRONMENTS_BUILT,
    NOT_BUILT_ENVIRONMENTS,
    check_env_config,
    environments_not_built,
    registered_env_section,
)
from nemo_rl_core.models.generation.config import GenerationConfig, VllmSpecificArgs
from nemo_rl_core.models.policy.config import TokenizerConfig
from nemo_rl_core.utils.key_support import Check, Only, PartOf, SupportContext, TypedSections, Wired

_EVAL = "nemo_rl_core.evals.eval"
_EVAL_ROWS = "nemo_rl_core.evals.config_check"
MAX_CONS_SUBSETS = 1_000_000  # cons@k enumerates them, as NeMo RL does
# NeMo RL's eval datasets that it downloads (load_eval_dataset's names); a name with "://"
# is a URL it downloads too.
HUB_EVAL_DATASETS = (
    "mmlu",
    "mmlu_pro",
    "aime2024",
    "aime2025",
    "aime2026",
    "gpqa",
    "gpqa_diamond",
    "math",
    "math500",
    "mmau",
    "TwinkStart/MMAU",
)


def _downloads_nothing(name: str, context: SupportContext) -> str | None:
    if name in HUB_EVAL_DATASETS or name.startswith("mmlu_") or "://" in name:
        return (
            "a dataset NeMo RL downloads, and this deployment downloads nothing; name a local "
            f"JSONL/Parquet file or save_to_disk folder, or a built-in ({', '.join(BUILTIN_DATASETS)})"
        )
    return None


class EvalConfig(StrictConfig):
    """``eval:``: how many samples per prompt and which score."""

    metric: Annotated[Literal["pass@k", "cons@k"], Wired(f"{_EVAL}:eval_metrics")] = "pass@k"
    num_tests_per_prompt: Annotated[int, Field(ge=1), Wired(f"{_EVAL}:eval_prompts")] = 1
    seed: Annotated[int, Wired(f"{_EVAL}:generate_answers")] = 42
    k_value: Annotated[int, Field(ge=1), Wired(f"{_EVAL}:eval_metrics")] = 1
    # Not NeMo RL's JSON: each run's evaluation_data.parquet and config.json go to
    # <save_path>/<run_id>/; null writes no files (the run's storage keeps every sample).
    save_path: Annotated[str | None, Wired("flows.evaluation:write_results")] = None

    @model_validator(mode="after")
    def _k_fits(self) -> Self:
        if self.k_value > self.num_tests_per_prompt:
            raise ValueError(
                f"k_value={self.k_value} exceeds num_tests_per_prompt="
                f"{self.num_tests_per_prompt}: pass@k needs at least k samples per prompt"
            )
        subsets = math.comb(self.num_tests_per_prompt, self.k_value)
        if self.metric == "cons@k" and subsets > MAX_CONS_SUBSETS:
            raise ValueError(
                f"metric=cons@k votes in every k-subset of each prompt's samples: "
                f"C({self.num_tests_per_prompt}, {self.k_value}) = {subsets} subsets, over "
                f"the {MAX_CONS_SUBSETS} that stay seconds; lower k_value or num_tests_per_prompt"
            )
        return self


class EvalVllmArgs(VllmSpecificArgs):
    """``generation.vllm_cfg`` of an eval config (the keys of the policy's, rooted here)."""

    vllm_metrics_logger_interval: Annotated[
        float, PartOf("generation.vllm_cfg.enable_vllm_metrics_logger")
    ] = Field(0.5, gt=0.0)


class EvalGenerationConfig(GenerationConfig):
    """``generation:``: the policy's generation keys, plus the model to score and how many
    prompts go to the engine at once."""

    model_name: Annotated[str, Wired("nemo_rl_core.pipeline.runtime:runtime_for")]  # type: ignore[assignment, unused-ignore]
    # -1: every prompt in one batch (NeMo RL's default)
    num_prompts_per_step: Annotated[int, Wired(f"{_EVAL}:generate_answers")] = -1
    sglang_cfg: Annotated[dict[str, Any] | None, PartOf("generation.backend")] = None
    mcore_generation_config: Annotated[dict[str, Any] | None, PartOf("generation.backend")] = None
    # A narrower section type than the parent's: mypy reads the override as a conflict.
    vllm_cfg: EvalVllmArgs = Field(default_factory=EvalVllmArgs)  # type: ignore[arg-type, unused-ignore]

    @model_validator(mode="after")
    def _prompts_per_step(self) -> Self:
        if self.num_prompts_per_step != -1 and self.num_prompts_per_step < 1:
            raise ValueError(
                f"num_prompts_per_step must be -1 (all at once) or >= 1, got "
                f"{self.num_prompts_per_step}"
            )
        return self


_PROMPT_FILES = ("prompt_file", "system_prompt_file")


class EvalDataConfig(StrictConfig):
    """``data:`` of an eval config (NeMo RL's keys): a built-in generator's held-out rows,
    or a local file whose ``problem_key`` and ``solution_key`` columns every row must hold."""

    dataset_name: Annotated[
        str, Check(_downloads_nothing, "built-ins and local files; downloaded names refused")
    ]
    prompt_file: Annotated[str | None, Wired(f"{_EVAL}:build_eval_dataset")] = None
    system_prompt_file: Annotated[str | None, Wired(f"{_EVAL}:build_eval_dataset")] = None
    max_input_seq_length: Annotated[int | None, Wired(f"{_EVAL}:build_eval_dataset")] = Field(
        None, ge=1
    )
    problem_key: Annotated[str, Wired(f"{_EVAL_ROWS}:eval_rows")] = "problem"
    solution_key: Annotated[str, Wired(f"{_EVAL_ROWS}:eval_rows")] = "expected_answer"
    split: Annotated[str | None, Wired(f"{_EVAL_ROWS}:eval_rows")] = None
    file_format: Annotated[
        str | None,
        Only(
            None,
            *FILE_FORMATS,
            reason="files are read by their suffix (.jsonl/.json, .parquet, .csv) or as a "
            "save_to_disk folder",
        ),
    ] = None
    env_name: Annotated[str | None, Wired(f"{_EVAL}:build_eval_dataset")] = None
    # Not in NeMo RL: how many rows a built-in generator draws, from which seed.
    num_samples: Annotated[int | None, Wired(f"{_EVAL_ROWS}:eval_rows")] = Field(None, ge=1)
    seed: Annotated[int, Wired(f"{_EVAL_ROWS}:eval_rows")] = 42

    def with_files_from(self, config_dir: Path) -> "EvalDataConfig":
        """Relative prompt files, and a dataset given as a file path, made absolute from
        ``config_dir`` (as a training config's ``data:``): the config runs from anywhere."""
        files = {key: input_file(getattr(self, key), config_dir) for key in _PROMPT_FILES}
        if Path(self.dataset_name).suffix or "/" in self.dataset_name:
            files["dataset_name"] = input_file(self.dataset_name, config_dir)
        return self.model_copy(update=files)

    @model_validator(mode="after")
    def _format_matches_the_file(self) -> Self:
        if self.file_format is None or self.file_format not in FILE_FORMATS:
            return self
        suffix = Path(self.dataset_name).suffix
        if suffix and suffix not in FILE_FORMATS[self.file_format]:
            raise ValueError(
                f"file_format={self.file_format!r} but dataset_name {self.dataset_name!r} "
                f"has suffix {suffix!r}"
            )
        return self

    @model_validator(mode="after")
    def _builtin_split(self) -> Self:
        if self.builtin and self.split not in (None, *SPLITS):
            raise ValueError(
                f"split={self.split!r}: the built-in {self.dataset_name!r} draws {SPLITS} rows "
                "(null: validation, the held-out ones)"
            )
        return self

    @property
    def builtin(self) -> bool:
        return self.dataset_name in BUILTIN_DATASETS


@dataclass(frozen=True)
class EvaluatedModel:
    """The weights being scored, in the shape the run's runtime loads a policy from."""

    model_name: str
    tokenizer: TokenizerConfig
    generation: EvalGenerationConfig


class EvalMasterConfig(StrictConfig):
    """The whole YAML of an eval run."""

    eval: EvalConfig
    generation: EvalGenerationConfig
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    data: EvalDataConfig
    env: Annotated[
        dict[str, dict[str, Any]],
        Check(environments_not_built, ENVIRONMENTS_BUILT),
        TypedSections(registered_env_section),
    ] = Field(default_factory=dict)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)

    @property
    def policy(self) -> EvaluatedModel:
        """The model under evaluation (``generation.model_name``), which the run's runtime
        loads as it loads a policy: its tokenizer, its generation engine."""
        return EvaluatedModel(self.generation.model_name, self.tokenizer, self.generation)

    @property
    def algorithm(self) -> EvalConfig:
        return self.eval

    @model_validator(mode="after")
    def _several_samples_are_sampled(self) -> Self:
        """NeMo RL's check: more than one test per prompt must sample, not decode greedily."""
        generation = self.generation
        if self.eval.num_tests_per_prompt > 1 and (
            generation.temperature == 0 or generation.top_k == 1
        ):
            raise ValueError(
                f"eval.num_tests_per_prompt={self.eval.num_tests_per_prompt} needs "
                f"generation.temperature > 0 and top_k != 1 (got temperature="
                f"{generation.temperature}, top_k={generation.top_k}): greedy samples repeat"
            )
        return self

    @model_validator(mode="after")
    def _environments_are_known(self) -> Self:
        """Each section validates into its environment's config now; one of an environment
        that is not built here (NeMo RL's audio eval's ``mmau``) loads, and the env key's
        rule refuses it before any work."""
        for name, settings in self.env.items():
            if name not in NOT_BUILT_ENVIRONMENTS:
                check_env_config(name, settings)
        return self
