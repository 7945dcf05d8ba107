"""Asynchronous GRPO vs synchronous (issue 20, item 3): samples/s and reward over the same
steps, side by side in one run.

Each variant is one GRPO flow run of the embedded default (``grpo_addition_tiny.yaml``,
validation off) in a subprocess of its own, so that its thread settings apply before torch
loads: ``OMP_NUM_THREADS`` is the OpenMP team of every thread that runs torch (the flow's,
which trains, and the rollout thread, which generates), and ``VLLM_CPU_OMP_THREADS_BIND``
the cores vLLM's engine binds its team to. Synchronous GRPO gets every core for each stage
in turn; asynchronous GRPO runs generation beside training, so the two sides share the
cores: given all of them each, they compete; given half each, they overlap.

samples/s = samples of iterations 1..N-1 / seconds from the end of iteration 0 (which pays
the engine's start-up) to the end of the last one, read from the manifests' commit times.

``--stack``: the same two runs (sync, async k=1) on the two-pool local stack instead
(``infra/``: PostgreSQL, Prefect server, moto S3, process workers): each a flow run of
``grpo/manual`` on the stack's worker, with generate and reward placed on ``rollout-pool``
and logprob and train on ``train-pool`` (``cluster.placement``), so that under async the
rollouts ahead and the training run in separate processes, each a flow run of its pool's
``stage`` deployment, reading and writing the run on S3.

Run:   .venv/bin/python bench/async.py               (20 steps per variant)
       .venv/bin/python bench/async.py --stack       (two-pool stack, 8 steps per variant)
Smoke: .venv/bin/python bench/async.py --smoke       (sync and async k=1, 3 steps, HF
       generation, not recorded)
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from common import SMOKE_OVERRIDES, flow_iteration_times, record

if TYPE_CHECKING:  # run storage loads torch: imported where a run is read
    from nemo_rl_core.storage.manifest import Manifest, StageEntry

CONFIG = "examples/configs/grpo_addition_tiny.yaml"
QUIET = ["grpo.val_at_start=false", "grpo.val_at_end=false", "grpo.val_period=0"]
ASYNC = [
    "grpo.async_grpo.enabled=true",
    "loss_fn.use_importance_sampling_correction=true",
]
ROOT = Path(__file__).resolve().parents[1]
ROLLOUT_SIDE = ("prompts", "generate", "reward")
PLACED = [
    "++cluster.placement.generate=rollout-pool",
    "++cluster.placement.reward=rollout-pool",
    "++cluster.placement.logprob=train-pool",
    "++cluster.placement.train=train-pool",
]


def variants(cores: int) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, overrides, environment) of each run, sync first."""
    half = max(1, cores // 2)
    every = {"OMP_NUM_THREADS": str(cores), "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}"}
    split = {
        "OMP_NUM_THREADS": str(half),
        "VLLM_CPU_OMP_THREADS_BIND": f"{cores - half}-{cores - 1}",
    }
    return [
        ("sync", [], every),
        ("async k=1, all cores each side", ASYNC, every),
        ("async k=1, half the cores each side", ASYNC, split),
        (
            "async k=2, half the cores each side",
            [*ASYNC, "grpo.async_grpo.max_trajectory_age_steps=2"],
            split,
        ),
    ]


def run_variant(overrides: list[str], env: dict[str, str], storage_root: str) -> dict:
    """One flow run in a subprocess; its samples/s and per-step rewards."""
    run_id = f"async-{uuid.uuid4().hex[:8]}"
    code = (
        "import sys; sys.path.insert(0, 'bench'); import common; from flows.grpo import grpo; "
        f"grpo(config_path={CONFIG!r}, overrides={overrides!r}, run_id={run_id!r}, "
        f"storage_root={storage_root!r})"
    )
    environment = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, check=True)
    from nemo_rl_core.storage.run_storage import RunStorage

    storage = RunStorage(storage_root, run_id)
    return measured([storage.read_manifest(i) for i in storage.iterations()])


def run_on_stack(variants: list[tuple[str, list[str]]], common: list[str]) -> dict[str, dict]:
    """Each variant as a flow run of ``grpo/manual`` on a fresh two-pool local stack, one
    after the other; its samples/s and rewards, read from the run's manifests on S3."""
    sys.path.insert(0, str(ROOT / "infra"))
    from local_stack import running_stack

    from nemo_rl_core.storage.run_storage import RunStorage

    results = {}
    with running_stack() as stack:
        deployments = stack.deploy_all()
        for pool in ("rollout-pool", "train-pool"):
            stack.restart_worker(pool)
        for name, overrides in variants:
            run_id = f"async-{uuid.uuid4().hex[:8]}"
            parameters = {
                "run_id": run_id,
                "config_path": CONFIG,
                "overrides": [*common, *overrides],
            }
            flow_run_id = stack.start_flow_run(deployments["grpo/manual"], parameters)
            final = stack.wait_for_flow_run(flow_run_id, timeout=7200)
            if final["state_type"] != "COMPLETED":
                last = stack.flow_run_logs(flow_run_id)[-1][-2000:]
                raise RuntimeError(f"{name}: flow run {final['state_name']}: {last}")
            storage = RunStorage(
                f"s3://{stack.bucket}", run_id, storage_options=stack.storage_options
            )
            results[name] = measured([storage.read_manifest(i) for i in storage.iterations()])
    return results


def measured(manifests: "list[Manifest]") -> dict:
    """samples/s, seconds per step, rewards and median generate/train compute of one run,
    from its manifests' stage entries, iteration by iteration."""
    timings = flow_iteration_times(manifests)
    stages = [manifest.stages for manifest in manifests]

    def ended(entries: "dict[str, StageEntry]") -> float:
        return entries["checkpoint"].finished_at.timestamp()

    samples = [entry["prompts"].metrics["num_samples"] for entry in stages]
    seconds = ended(stages[-1]) - ended(stages[0])
    return {
        "samples_per_s": sum(samples[1:]) / seconds,
        "seconds_per_step": seconds / (len(stages) - 1),
        "rewards": [entry["reward"].metrics["mean_reward"] for entry in stages],
        "generate_s": statistics.median(e["generate"].metrics["seconds"] for e in stages[1:]),
        "train_s": statistics.median(e["train"].metrics["seconds"] for e in stages[1:]),
        # Wall seconds of the run-ahead side (prompts, generate, reward) and of the rest of
        # the step: async can overlap the two, so sync's pair bounds what async can gain.
        "rollout_wall_s": statistics.median(sum(t[s] for s in ROLLOUT_SIDE) for t in timings),
        "total_wall_s": statistics.median(t["total"] for t in timings),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="default: 20, or 8 with --stack")
    parser.add_argument("--stack", action="store_true", help="on the two-pool local stack")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    steps = 3 if args.smoke else args.steps or (8 if args.stack else 20)
    common = [f"grpo.max_num_steps={steps}", *QUIET, *(SMOKE_OVERRIDES if args.smoke else [])]
    cores = os.cpu_count() or 1
    rows, results = [], {}
    if args.stack:
        stack_variants = [("sync", PLACED), ("async k=1, two pools", [*PLACED, *ASYNC])]
        results = run_on_stack(stack_variants, common)
        rows = [(name, {"OMP_NUM_THREADS": "-"}, result) for name, result in results.items()]
    else:
        with tempfile.TemporaryDirectory(prefix="bench-async-") as root:
            chosen = variants(cores)[:2] if args.smoke else variants(cores)
            for name, overrides, env in chosen:
                result = run_variant([*common, *overrides], env, root)
                results[name] = result
                rows.append((name, env, result))
    base = results["sync"]["samples_per_s"]
    lines = [
        f"{'variant':38} {'OMP':>3} {'samples/s':>9} {'vs sync':>7} {'s/step':>6} "
        f"{'gen s':>5} {'train s':>7} {'reward first 3':>14} {'last 3':>6} {'mean':>5}"
    ]
    for name, env, r in rows:
        rewards = r["rewards"]
        lines.append(
            f"{name:38} {env['OMP_NUM_THREADS']:>3} {r['samples_per_s']:9.1f} "
            f"{r['samples_per_s'] / base:6.2f}x {r['seconds_per_step']:6.2f} "
            f"{r['generate_s']:5.2f} {r['train_s']:7.2f} {statistics.mean(rewards[:3]):14.3f} "
            f"{statistics.mean(rewards[-3:]):6.3f} {statistics.mean(rewards):5.3f}"
        )
    sync = results["sync"]
    rollout, total = sync["rollout_wall_s"], sync["total_wall_s"]
    bound = total / max(rollout, total - rollout)
    lines.append(
        f"perfect overlap could reach {bound:.2f}x: sync's step {total:.2f} s (median wall) = "
        f"prompts+generate+reward {rollout:.2f} s + the rest {total - rollout:.2f} s"
    )
    table = "\n".join(lines)
    print(table)
    reading = (
        "samples/s over iterations 1..N-1 (iteration 0 pays the engine's start-up); 'gen s' "
        "and 'train s' are the median compute seconds of those stages (overlapping each "
        "other under async); rewards are the reward stage's mean per step. Async k steps "
        "generates step i from the weights of step i-k, so its reward curve is not sync's."
    )
    where = " on the two-pool stack" if args.stack else ""
    record(
        f"Async GRPO{where}: samples/s of asynchronous vs synchronous GRPO, same steps (issue 20)",
        table,
        reading,
        args.smoke,
    )


if __name__ == "__main__":
    main()
