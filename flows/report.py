"""What a run reports, read from its manifests: each iteration's metrics, the same under
NeMo RL's logger names, one terminal line per iteration, a summary table and a PNG of
the curves.

Any stored run, finished or not, can be shown again (nothing but its manifests and
config are read; the PNG goes to the run's log folder unless ``--plot`` says where):

    python -m flows.report --run-id grpo-20250101-120000-a1b2c3 --storage-root results/grpo_math_tiny
"""

import argparse
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nemo_rl_core.algorithms.config import PREFERENCE_VALIDATION_PREFIX
from nemo_rl_core.pipeline.spec import split_round
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.manifest import Manifest
from nemo_rl_core.storage.run_storage import RunStorage
from nemo_rl_core.utils.logger import LoggerConfig, run_log_dir

VALIDATION_STAGE = "validate"
# Keeps the checkpoints; an iteration that ran nothing else (validation after the last
# step) trained nothing, so it logs no training record.
BOOKKEEPING_STAGE = "checkpoint"
# NeMo RL's timer of the work a stage does (``timing/train/<name>``); others keep their name.
NEMO_RL_TIMERS = {
    "prompts": "data_processing",
    "generate": "generation",
    "reward": "reward_calculation",
    "logprob": "policy_and_reference_logprobs",
    "value": "value_inference",
    "advantage": "advantage_calculation",
    "teacher": "teacher_logprob_inference",
    "train": "policy_training",
    "checkpoint": "checkpointing",
}
# Our metric name -> NeMo RL's, under ``train/``. NeMo RL's ``reward`` is the one the
# advantages use: after reward scaling and shaping (``mean_total_reward``) where either is
# on; the environments' own mean is then ``env_reward``.
NEMO_RL_NAMES = {"reward/mean_reward": "reward", "reward/mean_total_reward": "reward"}
PROCESSED_REWARD = "mean_total_reward"


def manifest_metrics(manifest: Manifest) -> dict[str, float]:
    """Flat ``stage/metric`` numbers and ``seconds/stage`` of a manifest's complete stage
    entries, in the order the stages finished (the manifest keeps them by name)."""
    complete = [(s, e) for s, e in manifest.stages.items() if e.complete]
    flat: dict[str, float] = {}
    for stage, entry in sorted(complete, key=lambda item: item[1].finished_at):
        for key, value in entry.metrics.items():
            if isinstance(value, int | float):
                name = f"seconds/{stage}" if key == "seconds" else f"{stage}/{key}"
                flat[name] = float(value)
    return flat


def iteration_metrics(run: RunRef, iteration: int) -> dict[str, float]:
    """Flat ``stage/metric`` numbers and ``seconds/stage`` from the iteration's manifest."""
    return manifest_metrics(open_storage(run).read_manifest(iteration))


def _by_stage(metrics: Mapping[str, float]) -> Iterator[tuple[str, int, str, float]]:
    """``(stage, refill round, metric, value)`` of flat metrics (``seconds`` as a metric)."""
    for name, value in metrics.items():
        head, _, metric = name.partition("/")
        if head == "seconds":
            head, metric = metric, "seconds"
        stage, round_index = split_round(head)
        yield stage, round_index, metric, value


@dataclass(frozen=True)
class LogRecord:
    """One ``Logger.log_metrics`` call: metrics under a NeMo RL prefix at a NeMo RL step."""

    prefix: str
    step: int
    metrics: dict[str, float]


def nemo_rl_records(metrics: Mapping[str, float], iteration: int) -> list[LogRecord]:
    """An iteration's metrics as NeMo RL's ``grpo_train`` logs them.

    NeMo RL's step n is the policy after n updates: the training of iteration i logs at
    step i + 1 (``train/``, ``timing/train/``, ``performance/``) and validation, which
    measures the weights iteration i starts from, at step i (``validation/``,
    ``timing/validation/``). Rollout, reward, advantage and loss metrics all go under
    ``train/`` as there; a later refill round's value replaces an earlier one's, and the
    stage seconds of the rounds add up. A PPO value model's metrics are ``critic/``.
    """
    train: dict[str, float] = {}
    timing: dict[str, float] = {}
    validation: dict[str, float] = {}
    validation_seconds: dict[str, float] = {}
    trained = False
    processed = any(name.endswith(f"/{PROCESSED_REWARD}") for name in metrics)
    # Later refill rounds come last: their values replace the earlier rounds'.
    for stage, _, metric, value in sorted(_by_stage(metrics), key=lambda m: m[1]):
        trained = trained or stage not in (VALIDATION_STAGE, BOOKKEEPING_STAGE)
        if stage == VALIDATION_STAGE:
            if metric == "seconds":
                validation_seconds["total_validation_time"] = value
            else:
                validation[metric] = value
        elif metric == "seconds":
            timer = NEMO_RL_TIMERS.get(stage, stage)
            timing[timer] = timing.get(timer, 0.0) + value
        elif metric.startswith("value_"):
            train[f"critic/{metric.removeprefix('value_')}"] = value
        elif processed and f"{stage}/{metric}" == "reward/mean_reward":
            train["env_reward"] = value
        else:
            train[NEMO_RL_NAMES.get(f"{stage}/{metric}", metric)] = value
    records = []
    if validation:
        records.append(LogRecord("validation", iteration, validation))
        records.append(LogRecord("timing/validation", iteration, validation_seconds))
    if trained:
        timing["total_step_time"] = sum(timing.values())
        records.append(LogRecord("train", iteration + 1, train))
        records.append(LogRecord("timing/train", iteration + 1, timing))
        records.append(LogRecord("performance", iteration + 1, performance(metrics, timing)))
    return records


def generated_tokens_per_second(metrics: Mapping[str, float]) -> float | None:
    """Generated tokens per second of the generate stage (every refill round's together)."""
    tokens = seconds = 0.0
    for stage, round_index, metric, value in _by_stage(metrics):
        if stage == "generate" and metric == "mean_gen_tokens_per_sample":
            samples = metrics.get(f"{_recorded('prompts', round_index)}/num_samples", math.nan)
            tokens += value * samples
            seconds += metrics.get(f"seconds/{_recorded('generate', round_index)}", math.nan)
    rate = tokens / seconds if seconds > 0 else math.nan
    return rate if math.isfinite(rate) else None


def _recorded(stage: str, round_index: int) -> str:
    return stage if round_index == 0 else f"{stage}.{round_index}"


def performance(metrics: Mapping[str, float], timing: Mapping[str, float]) -> dict[str, float]:
    """NeMo RL's ``performance/samples_per_sec`` and our ``generated_tokens_per_sec``."""
    total = timing["total_step_time"]
    values = {}
    if "prompts/num_samples" in metrics and total > 0:
        values["samples_per_sec"] = metrics["prompts/num_samples"] / total
    tokens_per_second = generated_tokens_per_second(metrics)
    if tokens_per_second is not None:
        values["generated_tokens_per_sec"] = tokens_per_second
    return values


def preference_validation(metrics: Mapping[str, float], name: str) -> float | None:
    """A DPO or reward-model validation metric (NeMo RL's ``validation-<set>_<name>``): the
    ``default`` set's, else the first named set's (``data.val_data_paths``)."""
    default = metrics.get(f"validate/{PREFERENCE_VALIDATION_PREFIX}{name}")
    if default is not None:
        return default
    named = sorted(
        key
        for key in metrics
        if key.startswith("validate/validation-") and key.endswith(f"_{name}")
    )
    return metrics[named[0]] if named else None


@dataclass(frozen=True)
class IterationSummary:
    """What a person watches per iteration (None where the iteration did not measure it)."""

    iteration: int
    reward: float | None
    # the stored total_reward the advantages use, where scaling or shaping changed it
    total_reward: float | None
    val_accuracy: float | None
    greedy_accuracy: float | None
    val_loss: float | None
    loss: float | None
    kl: float | None
    clip_fraction: float | None
    entropy: float | None
    gen_length: float | None
    gen_tokens_per_s: float | None
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_metrics(cls, iteration: int, metrics: Mapping[str, float]) -> "IterationSummary":
        return cls(
            iteration=iteration,
            reward=metrics.get("reward/mean_reward"),
            total_reward=metrics.get(f"reward/{PROCESSED_REWARD}"),
            # DPO and reward models validate under NeMo RL's names: preference accuracy
            val_accuracy=metrics.get(
                "validate/accuracy", preference_validation(metrics, "accuracy")
            ),
            greedy_accuracy=metrics.get("validate/greedy_accuracy"),
            val_loss=metrics.get("validate/val_loss", preference_validation(metrics, "loss")),
            loss=metrics.get("train/loss"),
            kl=metrics.get("train/kl_penalty"),
            clip_fraction=metrics.get("train/probs_ratio_clamped_fraction"),
            entropy=metrics.get("train/approx_entropy"),
            gen_length=metrics.get("generate/mean_gen_tokens_per_sample"),
            gen_tokens_per_s=generated_tokens_per_second(metrics),
            stage_seconds={
                name.removeprefix("seconds/"): value
                for name, value in metrics.items()
                if name.startswith("seconds/")
            },
        )

    @property
    def seconds(self) -> float:
        return sum(self.stage_seconds.values())


def format_line(summary: IterationSummary) -> str:
    """The iteration's terminal line: what it measured, then seconds per stage."""
    s = summary
    parts = [f"iter {s.iteration:>3}"]
    if s.reward is not None:
        total = (
            f" (scaled/shaped total_reward {reward_text(s.total_reward)})"
            if s.total_reward is not None
            else ""
        )
        parts.append(f"reward {reward_text(s.reward)}{total}")
    if s.val_accuracy is not None:
        greedy = f" (greedy {s.greedy_accuracy:.3f})" if s.greedy_accuracy is not None else ""
        parts.append(f"val acc {s.val_accuracy:.3f}{greedy}")
    for label, value, spec in (
        ("val loss", s.val_loss, ".4g"),
        ("loss", s.loss, ".4g"),
        ("kl", s.kl, ".3g"),
        ("clip", s.clip_fraction, ".3f"),
        ("entropy", s.entropy, ".3g"),
        ("gen len", s.gen_length, ".1f"),
        ("gen tok/s", s.gen_tokens_per_s, ".0f"),
    ):
        if value is not None:
            parts.append(f"{label} {value:{spec}}")
    stages = " ".join(f"{name} {sec:.1f}" for name, sec in s.stage_seconds.items())
    parts.append(f"{s.seconds:.1f} s ({stages})")
    return " | ".join(parts)


def reward_text(value: float) -> str:
    """A reward with three decimals, or in scientific notation where those would show 0.000
    (a reward model's scores around 1e-5)."""
    return f"{value:.3f}" if value == 0 or abs(value) >= 5e-4 else f"{value:.2e}"


_COLUMNS: tuple[
    tuple[str, Callable[[IterationSummary], float | None], str | Callable[[float], str]], ...
] = (
    ("iter", lambda s: s.iteration, "d"),
    ("reward", lambda s: s.reward, reward_text),
    ("total rwd", lambda s: s.total_reward, reward_text),
    ("val acc", lambda s: s.val_accuracy, ".3f"),
    ("greedy", lambda s: s.greedy_accuracy, ".3f"),
    ("val loss", lambda s: s.val_loss, ".4g"),
    ("loss", lambda s: s.loss, ".4g"),
    ("kl", lambda s: s.kl, ".3g"),
    ("clip", lambda s: s.clip_fraction, ".3f"),
    ("entropy", lambda s: s.entropy, ".3g"),
    ("gen len", lambda s: s.gen_length, ".1f"),
    ("tok/s", lambda s: s.gen_tokens_per_s, ".0f"),
    ("seconds", lambda s: s.seconds, ".1f"),
)


def summary_row(summary: IterationSummary) -> dict[str, str]:
    """One iteration's row of the summary table, by column ("-" where not measured)."""
    row = {}
    for name, get, spec in _COLUMNS:
        value = get(summary)
        if value is None:
            row[name] = "-"
        else:
            row[name] = spec(value) if callable(spec) else f"{value:{spec}}"
    return row


# Shown only where some iteration has a value (runs that scale or shape their rewards).
_OPTIONAL_COLUMNS = ("total rwd",)


def summary_table(run_id: str, summaries: list[IterationSummary]) -> str:
    """The run's table, one row per iteration, and how reward and accuracy moved."""
    rows = [summary_row(summary) for summary in summaries]
    names = [
        name
        for name, _, _ in _COLUMNS
        if name not in _OPTIONAL_COLUMNS or any(row[name] != "-" for row in rows)
    ]
    cells = [names, *([row[name] for name in names] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(names))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join([f"run {run_id}: {len(summaries)} iterations", *lines, *_movement(summaries)])


def _movement(summaries: list[IterationSummary]) -> list[str]:
    moved = []
    for label, get in (
        ("mean reward", lambda s: s.reward),
        ("mean total_reward (scaled/shaped)", lambda s: s.total_reward),
        ("validation accuracy", lambda s: s.val_accuracy),
        ("greedy validation accuracy", lambda s: s.greedy_accuracy),
        ("validation loss", lambda s: s.val_loss),
    ):
        points = [(s.iteration, get(s)) for s in summaries if get(s) is not None]
        if len(points) >= 2:
            (first_at, first), (last_at, last) = points[0], points[-1]
            moved.append(
                f"{label}: {reward_text(first)} (iter {first_at}) -> {reward_text(last)} "
                f"(iter {last_at})"
            )
    return moved


_PANELS = (
    (
        "mean reward / validation accuracy",
        ("reward", "total_reward", "val_accuracy", "greedy_accuracy"),
    ),
    ("loss / validation loss", ("loss", "val_loss")),
    ("KL penalty", ("kl",)),
    ("clip fraction", ("clip_fraction",)),
    ("entropy (approx.)", ("entropy",)),
    ("generated tokens / sample", ("gen_length",)),
    ("generated tokens / s", ("gen_tokens_per_s",)),
    ("seconds / iteration", ("seconds",)),
)


def plot_curves(run_id: str, summaries: list[IterationSummary], path: Path) -> Path:
    """A PNG of the run's curves against the iteration (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 4, figsize=(16, 7), sharex=True)
    for ax, (title, names) in zip(axes.flat, _PANELS, strict=True):
        for name in names:
            points = [(s.iteration, getattr(s, name)) for s in summaries]
            points = [(x, y) for x, y in points if y is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=name.replace("_", " "))
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if len(names) > 1 and ax.has_data():
            ax.legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"run {run_id}")
    # fixed margins for this fixed grid: tight_layout would measure every label, ~0.25 s of
    # a flow run's end on 2 cores, for the same picture
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.07, top=0.91, wspace=0.22, hspace=0.22)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_summaries(storage: RunStorage) -> list[IterationSummary]:
    """Every stored iteration's summary, in order."""
    return [
        IterationSummary.from_metrics(iteration, manifest_metrics(storage.read_manifest(iteration)))
        for iteration in storage.iterations()
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flows.report", description="Print and plot a stored run's metrics."
    )
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--storage-root", required=True, help="the run's storage root")
    parser.add_argument("--plot", default=None, help="PNG path (default: the run's log folder)")
    args = parser.parse_args(argv)
    storage = open_storage(RunRef(args.storage_root, args.run_id))
    stored = storage.read_run_config()
    if stored is None:
        print(f"error: no run {args.run_id!r} under {args.storage_root}", file=sys.stderr)
        raise SystemExit(2)
    summaries = run_summaries(storage)
    for summary in summaries:
        print(format_line(summary))
    print(summary_table(args.run_id, summaries))
    logger = LoggerConfig.model_validate(stored.get("logger", {}))
    plot = Path(args.plot) if args.plot else run_log_dir(logger, args.run_id) / "curves.png"
    print(f"curves: {plot_curves(args.run_id, summaries, plot)}")


if __name__ == "__main__":
    main()
