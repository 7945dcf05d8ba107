"""A toy algorithm declared as the real ones are (a :class:`Pipeline` of stages over stored
batches and JSON), whose stages need no torch and no model: the orchestration rules
(resume, skip, refill, fan-out, damage, deadlines, staleness, run-ahead) are tested on it in
seconds, through the same flow, tasks, storage and manifest as GRPO's.

It learns to add: the "policy" is three numbers ``w`` (a safetensors file of numpy floats,
committed as every checkpoint is), its answer to ``a + b`` is ``w . (a, b, 1)``, and the
update is one step of gradient descent on the squared error.

    [validate] -> prompts -> answer -> score -> update -> checkpoint

``prompts`` draws addition problems from ``data:`` (the project's own built-in dataset, read
as rows), ``answer`` reads the weights of its iteration (or, running ahead, older ones),
``score`` splits into shards (``orchestration.fan_out``) and, with ``toy.refill``, keeps
the problems with an even sum until a step's batch is full, refilling from more prompts.
"""

import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field
from safetensors.numpy import load_file, save_file

from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.config.checkpointing import CheckpointingConfig
from nemo_rl_core.config.cluster import ClusterConfig
from nemo_rl_core.config.logger import LoggerConfig
from nemo_rl_core.config.orchestration import OrchestrationConfig
from nemo_rl_core.data.config import DataConfig
from nemo_rl_core.data.datasets.builder import DataSetup, load_rows
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.pipeline.algorithms import RETENTION, validation_is_due
from nemo_rl_core.pipeline.context import PREVIOUS, StageContext, StageResult
from nemo_rl_core.pipeline.spec import FanOut, Pipeline, Refill, RunAhead, Stage, shard_bounds
from nemo_rl_core.utils.checkpoint import WEIGHTS_FILE

INITIAL_WEIGHTS = (0.5, 0.25, 0.0)
_PROBLEM = re.compile(r"(\d+) \+ (\d+)")


class ToySection(StrictConfig):
    """``toy:``: the run's length, batch and step size, validation schedule, and switches
    for the refill and run-ahead rules."""

    max_num_steps: int = Field(3, ge=1)
    max_num_epochs: int = Field(100, ge=1)
    batch_size: int = Field(4, ge=1)
    learning_rate: float = 2e-5
    val_period: int = 0
    val_at_start: bool = False
    val_at_end: bool = False
    refill: bool = False
    run_ahead_steps: Annotated[int, Field(ge=0)] = 0
    seed: int = 0


class ToyModelConfig(StrictConfig):
    model_name: str


class ToyConfig(StrictConfig):
    toy: ToySection = Field(default_factory=ToySection)
    policy: ToyModelConfig
    data: DataConfig
    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)

    @property
    def algorithm(self) -> ToySection:
        return self.toy


class ToyModel:
    """The policy: weights saved as a checkpoint's ``model.safetensors``."""

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = weights

    @classmethod
    def load(cls, folder: Path) -> "ToyModel":
        return cls(load_file(str(folder / WEIGHTS_FILE))["w"])

    def save_checkpoint(self, weights_path: str, optimizer_path: str) -> None:
        folder = Path(weights_path)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"w": self.weights}, str(folder / WEIGHTS_FILE))
        (folder / "config.json").write_text('{"model_type": "toy"}\n')


def write_initial_model(folder: Path) -> Path:
    ToyModel(np.array(INITIAL_WEIGHTS)).save_checkpoint(str(folder), str(folder / "optimizer"))
    return folder


class ToyLoader:
    """Addition problems ``(a, b, sum)`` in order, ``batch_size`` per step; its state is the
    position of the next problem (epochs wrap around)."""

    def __init__(self, config: ToyConfig, split: str = "train") -> None:
        rows = load_rows(config.data, split, setup=DataSetup())
        self.problems = [problem(row) for row in rows]
        self.batch_size = config.toy.batch_size

    def __len__(self) -> int:
        return len(self.problems) // self.batch_size

    def state_dict(self) -> dict[str, int]:
        return {"position": 0}

    def take(self, state: dict[str, int]) -> tuple[BatchedDataDict, dict[str, int]]:
        start = state["position"]
        drawn = [self.problems[(start + i) % len(self.problems)] for i in range(self.batch_size)]
        a, b, total = (list(column) for column in zip(*drawn, strict=True))
        return BatchedDataDict(a=a, b=b, sum=total), {"position": start + self.batch_size}


def problem(row: dict[str, Any]) -> tuple[int, int, int]:
    match = _PROBLEM.search(row["problem"])
    if match is None:
        raise ValueError(f"not an addition problem: {row['problem']!r}")
    return int(match[1]), int(match[2]), int(row["expected_answer"])


def make_loader(config: ToyConfig, tokenizer: None) -> ToyLoader:
    return ToyLoader(config)


def weights(ctx: StageContext, step: int) -> np.ndarray:
    return ToyModel.load(ctx.runtime.weights_dir(step)).weights


def predictions(w: np.ndarray, batch: BatchedDataDict) -> np.ndarray:
    return w[0] * np.array(batch["a"], float) + w[1] * np.array(batch["b"], float) + w[2]


def toy_validation(ctx: StageContext) -> StageResult:
    """Accuracy (rounded answers right) of the weights this iteration starts from on the
    held-out problems."""
    held_out = ToyLoader(ctx.config, "validation")
    batch, _ = held_out.take({"position": 0})
    right = np.rint(predictions(weights(ctx, ctx.iteration), batch)) == np.array(batch["sum"])
    metrics = {"accuracy": float(right.mean())}
    return StageResult({"metrics": metrics}, metrics)


def toy_prompts(ctx: StageContext) -> StageResult:
    """The loader's next problems; a refill round continues where its previous round left."""
    if PREVIOUS in ctx.upstream:
        start = ctx.json(PREVIOUS, "dataloader_state")
    else:
        start = ctx.runtime.dataloader_state(ctx.iteration)
    batch, state = ctx.runtime.dataloader.take(start)
    return StageResult({"batch": batch, "dataloader_state": state}, {"num_samples": batch.size})


def toy_answer(ctx: StageContext) -> StageResult:
    """The policy's answers, from the weights of ``ctx.weights_step``."""
    batch = ctx.batch("prompts")
    answered = BatchedDataDict(
        {**batch, "answer": predictions(weights(ctx, ctx.weights_step), batch).tolist()}
    )
    return StageResult({"batch": answered}, {"weights_step": ctx.weights_step})


def toy_score_widest(config: Any) -> tuple[int, str]:
    """A shard holds whole samples: at most one per problem of a step's batch."""
    return config.toy.batch_size, f"toy.batch_size={config.toy.batch_size} samples"


def toy_score_shard(ctx: StageContext, index: int, count: int) -> BatchedDataDict:
    answered = ctx.batch("answer")
    start, end = shard_bounds(answered.size, index, count)
    part = answered.slice(start, end)
    errors = np.array(part["answer"]) - np.array(part["sum"], float)
    return BatchedDataDict({**part, "reward": (-(errors**2)).tolist()})


def toy_score_merge(ctx: StageContext, shards: list[BatchedDataDict]) -> StageResult:
    """The shards joined in order; with ``toy.refill``, the problems with an even sum kept
    (with those of earlier rounds) until ``batch_size`` are."""
    scored: BatchedDataDict[Any] = BatchedDataDict.from_batches(shards)
    metrics = {"mean_reward": float(np.mean(scored["reward"]))}
    if not ctx.config.toy.refill:
        return StageResult({"batch": scored}, metrics)
    even = [i for i, total in enumerate(scored["sum"]) if total % 2 == 0]
    kept = scored.select_indices(even)
    if PREVIOUS in ctx.upstream:
        kept = BatchedDataDict.from_batches([ctx.batch(PREVIOUS), kept])
    size = ctx.config.toy.batch_size
    complete = kept.size >= size
    if complete:
        kept = kept.slice(0, size)
    selection = {"complete": complete}
    return StageResult({"batch": kept, "selection": selection}, {**metrics, "kept": kept.size})


def toy_score(ctx: StageContext) -> StageResult:
    return toy_score_merge(ctx, [toy_score_shard(ctx, 0, 1)])


def toy_update(ctx: StageContext) -> StageResult:
    """One gradient step on the squared error of the scored problems, committed as the
    checkpoint the next iteration starts from."""
    batch = ctx.batch("score")
    w = weights(ctx, ctx.iteration)
    inputs = np.stack([np.array(batch["a"], float), np.array(batch["b"], float)], axis=1)
    inputs = np.concatenate([inputs, np.ones((batch.size, 1))], axis=1)
    errors = inputs @ w - np.array(batch["sum"], float)
    updated = w - ctx.config.toy.learning_rate * (errors @ inputs) / batch.size
    metrics = {"loss": float(np.mean(errors**2))}
    url = ctx.runtime.commit_checkpoint(
        ctx.iteration + 1,
        {"policy": ToyModel(updated)},
        ctx.json("prompts", "dataloader_state"),
        metrics,
    )
    return StageResult({"metrics": {**metrics, "checkpoint": url}}, metrics)


ROLLOUT = ("prompts", "answer", "score")
TOY = Pipeline(
    name="toy",
    config_class=ToyConfig,
    default_config=str(Path(__file__).with_name("toy.yaml")),
    identity_keys=("policy.model_name", "data", "toy.seed"),
    refill=Refill(stages=ROLLOUT, enabled=lambda config: config.toy.refill),
    run_ahead=RunAhead(
        stages=ROLLOUT, lagged=("answer",), depth=lambda config: config.toy.run_ahead_steps
    ),
    dataloader=make_loader,
    data_setup=lambda config: DataSetup(),
    tokenized=False,
    stages=(
        Stage(
            "validate",
            toy_validation,
            versions=("policy",),
            reported=("accuracy",),
            due=validation_is_due,
        ),
        Stage("prompts", toy_prompts, versions=("dataloader",)),
        Stage("answer", toy_answer, reads=("prompts",), versions=("policy",)),
        Stage(
            "score",
            toy_score,
            reads=("answer",),
            reported=("mean_reward",),
            fan_out=FanOut(toy_score_shard, toy_score_merge, toy_score_widest),
        ),
        Stage(
            "update",
            toy_update,
            reads=("score", "prompts"),
            versions=("policy",),
            reported=("loss",),
            commits=True,
        ),
        replace(RETENTION, optional_reads=("update", "validate")),
    ),
)
