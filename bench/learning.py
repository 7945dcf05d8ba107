"""Learning, measured (issue 19): held-out greedy accuracy before and after GRPO on the
embedded default, over seeds, with the HF and the Megatron-core training backends.

Each row is one GRPO flow run of ``examples/configs/grpo_addition_tiny.yaml`` (what
``make run`` runs) with ``grpo.seed`` set, in this process on Prefect's ephemeral API and
local storage. Accuracies are read back from the ``validate`` stages in the run's manifests:
greedy answers to the held-out additions (pairs never trained on), at step 0 (the SFT warm
start) and at the last step. The model is built first in a fresh cache, so its build time
(what a first ``make run`` pays once) is measured too; smoke runs reuse the cached model.

Run:   .venv/bin/python bench/learning.py                  (seeds 42 43 44, Megatron on 42)
Smoke: .venv/bin/python bench/learning.py --smoke          (1 step of 4x4, 8 held-out problems)
"""

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from common import PLOTS, machine_line, record

CONFIG = "examples/configs/grpo_addition_tiny.yaml"
MEGATRON = ["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"]
# One step of 4x4 samples between two validations of 8 problems: the start and end the table
# reads, each backend's whole step; a second step would add nothing the smoke checks.
SMOKE_OVERRIDES = [
    "grpo.max_num_steps=1",
    "grpo.val_period=1",
    "grpo.max_val_samples=8",
    "grpo.val_batch_size=8",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=16",
]


def build_model() -> float:
    """Seconds to build tiny-llama-arith in the model cache (none if it is there)."""
    from nemo_rl_core.models.local_models import resolve_model

    start = time.perf_counter()
    resolve_model("tiny-llama-arith")
    return time.perf_counter() - start


def learning_run(overrides: list[str], storage_root: str) -> dict:
    """One flow run: wall seconds and the held-out greedy accuracy at each validation."""
    from flows.grpo import grpo
    from nemo_rl_core.storage.run_storage import RunStorage

    run_id = f"learn-{uuid.uuid4().hex[:8]}"
    start = time.perf_counter()
    summary = grpo(
        config_path=CONFIG, overrides=overrides, run_id=run_id, storage_root=storage_root
    )
    seconds = time.perf_counter() - start
    storage = RunStorage(storage_root, run_id)
    curve = {}
    for iteration in summary["iterations"]:
        validate = storage.read_manifest(iteration).stages.get("validate")
        if validate is not None:
            curve[iteration] = validate.metrics["greedy_accuracy"]
    return {"seconds": seconds, "curve": curve}


def format_table(rows: list[tuple[str, int, dict]]) -> str:
    lines = [f"{'backend':<9}{'seed':>5}{'start':>8}{'end':>8}{'gain':>8}{'steps':>7}{'wall s':>8}"]
    for backend, seed, run in rows:
        steps = max(run["curve"])
        start, end = run["curve"][0], run["curve"][steps]
        lines.append(
            f"{backend:<9}{seed:>5}{start:>8.3f}{end:>8.3f}{end - start:>+8.3f}"
            f"{steps:>7}{run['seconds']:>8.0f}"
        )
    gains = [run["curve"][max(run["curve"])] - run["curve"][0] for b, _, run in rows if b == "hf"]
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    lines.append(f"hf gain over {len(gains)} seeds: {statistics.mean(gains):+.3f} +- {spread:.3f}")
    return "\n".join(lines)


def plot(rows: list[tuple[str, int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for backend, seed, run in rows:
        steps = sorted(run["curve"])
        style = "--" if backend == "megatron" else "-"
        label = f"{backend}, seed {seed}"
        ax.plot(steps, [run["curve"][s] for s in steps], style, marker="o", label=label)
    ax.set(xlabel="GRPO step", ylabel="held-out greedy accuracy", ylim=(0, 1.02))
    ax.set(title="tiny-llama-arith, GRPO on the math verifier's reward (CPU)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    parser.add_argument("--no-megatron", action="store_true", help="leave out the Megatron row")
    parser.add_argument("--smoke", action="store_true", help="one seed, 1 step of 4x4, 8 problems")
    args = parser.parse_args()
    if args.smoke:
        args.seeds = args.seeds[:1]
    print(machine_line(), flush=True)
    extra = SMOKE_OVERRIDES if args.smoke else []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.smoke:  # smoke runs reuse the cached model: the build is ~2 minutes
            os.environ["NEMO_RL_CORE_MODEL_CACHE"] = str(Path(tmp) / "models")
        build_seconds = build_model()
        print(f"tiny-llama-arith built in {build_seconds:.0f} s", flush=True)
        plan = [("hf", seed, []) for seed in args.seeds]
        if not args.no_megatron:
            plan.append(("megatron", args.seeds[0], MEGATRON))
        rows = []
        for backend, seed, backend_overrides in plan:
            overrides = [f"grpo.seed={seed}", *backend_overrides, *extra]
            run = learning_run(overrides, f"file://{tmp}/store")
            rows.append((backend, seed, run))
            print(f"{backend} seed {seed}: {run['curve']} in {run['seconds']:.0f} s", flush=True)
        table = format_table(rows)
        print(table)
        png = (Path(tmp) if args.smoke else PLOTS) / "learning.png"
        PLOTS.mkdir(exist_ok=True)
        plot(rows, png)
    record(
        "Learning: held-out greedy accuracy before and after GRPO (issue 19)",
        f"tiny-llama-arith built in {build_seconds:.0f} s\n{table}\nplot: bench/plots/{png.name}",
        "Each row is one run of the config with `grpo.seed` set; 'start' is the warm start "
        "(step 0), 'end' the last step, both greedy accuracy on the same 256 held-out "
        "additions; 'wall s' is the whole flow run (Prefect start-up, vLLM engine, every "
        "validation), the model already built.",
        args.smoke,
    )


if __name__ == "__main__":
    main()
