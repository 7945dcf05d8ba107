"""The SmolLM2-135M-Instruct GRPO demo (issue 7): mean reward per iteration, as a curve.

Runs ``flows.grpo`` on ``examples/configs/grpo_math_smollm2.yaml`` on the embedded default
(Prefect's ephemeral API, local storage), then reads every iteration's metrics back from
the run's manifests on storage (what the flow itself reports) and plots mean reward,
generation length, loss and KL per iteration. The curve is not a timing figure: run it at
normal priority, not under the bench lock.

    .venv/bin/python bench/demo_smollm2.py                       # a new run, then the plot
    .venv/bin/python bench/demo_smollm2.py --run-id demo1        # continue/finish run demo1
    .venv/bin/python bench/demo_smollm2.py --run-id demo1 --plot-only
    .venv/bin/python bench/demo_smollm2.py --smoke               # tiny model, 2 iterations
"""

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

from common import PLOTS, SMOKE_OVERRIDES, TINY_CONFIG, machine_line

import flows  # noqa: F401  (first: its process settings, e.g. OMP_WAIT_POLICY, precede torch)
from flows.report import iteration_metrics
from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.storage.handles import RunRef, open_storage

DEMO_CONFIG = "examples/configs/grpo_math_smollm2.yaml"
# (manifest metric, axis label): the reward first, the rest explain it.
PANELS = (
    ("reward/mean_reward", "mean reward"),
    ("generate/mean_generation_length", "generated tokens / sample"),
    ("train/loss", "train loss"),
    ("train/grad_norm", "grad norm"),
)


def run_demo(config: str, run_id: str, storage_root: str, overrides: list[str]) -> float:
    """Run (or continue) the GRPO flow to its ``grpo.max_num_steps``; wall seconds."""
    from flows.grpo import grpo

    start = time.perf_counter()
    grpo(config_path=config, overrides=overrides, run_id=run_id, storage_root=storage_root)
    return time.perf_counter() - start


def read_history(run: RunRef) -> list[dict[str, float]]:
    """Metrics of each iteration that finished its train stage, in order."""
    history = []
    for iteration in open_storage(run).iterations():
        metrics = iteration_metrics(run, iteration)
        if "train/loss" not in metrics:
            break  # an unfinished iteration (a run still going, or a failed one)
        history.append({"iteration": float(iteration), **metrics})
    return history


def iteration_seconds(run: RunRef, iterations: int) -> list[float]:
    """Wall seconds of each iteration after the first: checkpoint commit to commit."""
    storage = open_storage(run)
    commits = [storage.read_manifest(i).stages["checkpoint"].finished_at for i in range(iterations)]
    return [(b - a).total_seconds() for a, b in zip(commits, commits[1:], strict=False)]


def table(history: list[dict[str, float]]) -> str:
    """One row per iteration: the plotted metrics and the stages' compute seconds."""
    head = ["iter", *(label for _, label in PANELS), "compute s"]
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for entry in history:
        compute = sum(v for k, v in entry.items() if k.startswith("seconds/"))
        cells = [f"{int(entry['iteration'])}"]
        cells += [f"{entry[key]:.4g}" if key in entry else "-" for key, _ in PANELS]
        rows.append(" | ".join([*cells, f"{compute:.0f}"]))
    return "\n".join(f"| {row} |" for row in rows)


def plot(history: list[dict[str, float]], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    steps = [entry["iteration"] for entry in history]
    for ax, (key, label) in zip(axes.flat, PANELS, strict=True):
        ax.plot(steps, [entry.get(key, float("nan")) for entry in history], marker="o")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("GRPO iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEMO_CONFIG)
    parser.add_argument("--run-id", default=None, help="continue or plot this run")
    parser.add_argument(
        "--storage-root", default=None, help="default: checkpointing.checkpoint_dir"
    )
    parser.add_argument("--plot-only", action="store_true", help="read a run, do not train")
    parser.add_argument("--out", type=Path, default=PLOTS / "demo_smollm2.png")
    parser.add_argument("--smoke", action="store_true", help="tiny model, HF generation, 2 steps")
    parser.add_argument("overrides", nargs="*", help="key.path=value config overrides")
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory()
    if args.smoke:
        args.config = TINY_CONFIG
        args.overrides = [*SMOKE_OVERRIDES, "grpo.max_num_steps=2", *args.overrides]
        args.storage_root = args.storage_root or scratch.name
    config = load_master_config(args.config, args.overrides)
    run = RunRef(
        args.storage_root or config.checkpointing.checkpoint_dir,
        args.run_id or f"demo-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}",
    )
    print(f"run {run.run_id} on {run.storage_root}; {machine_line()}", flush=True)
    wall = None
    if not args.plot_only:
        wall = run_demo(args.config, run.run_id, run.storage_root, args.overrides)
    history = read_history(run)
    if not history:
        sys.exit(f"run {run.run_id} on {run.storage_root} has no finished iteration")
    per_iteration = iteration_seconds(run, len(history))
    summary = f"{len(history)} iterations"
    if wall is not None:
        summary += f", wall {wall / 60:.1f} min"
    if per_iteration:
        summary += f", median {sorted(per_iteration)[len(per_iteration) // 2]:.0f} s/iteration"
        summary += " after the first"
    print(table(history))
    print(summary)
    plot(history, f"GRPO {Path(args.config).name} (run {run.run_id}): {summary}", args.out)
    print(f"plot: {args.out}")
    if args.smoke:
        print("smoke mode: not recorded in bench/RESULTS.md")
    scratch.cleanup()


if __name__ == "__main__":
    main()
