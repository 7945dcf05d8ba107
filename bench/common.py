"""What the issue-8 benchmarks share: the machine line, medians, the RESULTS.md record, a
local S3 server, and timing of a GRPO flow run read back from its manifests.

A flow run's stages are timed from storage, not from inside the flow: each manifest entry
holds the stage's compute seconds and when it was committed, so one stage's wall time is
the gap between two commits and the rest of that gap is orchestration and handoff.
"""

import datetime as dt
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # run storage loads torch: imported where a run is read
    from nemo_rl_core.storage.manifest import Manifest, StageEntry

# On a loaded machine Prefect's ephemeral API server can take minutes to answer; set before
# any import of prefect (flows/__init__.py sets a shorter default).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")
# The product's process defaults (OpenMP wait policy), set before anything loads torch, so
# that the plain loop and the flow of a benchmark run as a flow run would: import this
# module before torch.
import flows  # noqa: E402, F401, I001

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infra"))
from moto_server import running_moto_server  # noqa: E402

RESULTS = Path(__file__).with_name("RESULTS.md")
PLOTS = Path(__file__).with_name("plots")
TINY_CONFIG = "examples/configs/grpo_math_tiny.yaml"
# Smoke runs generate with HF: vLLM's engine start-up alone would take most of their minute.
SMOKE_OVERRIDES = ["policy.generation.backend=hf"]


def every_iteration_stages() -> tuple[str, ...]:
    """GRPO's stages that run in every iteration (validation has its own schedule). Imported
    when called: TRL's venv imports this module too, without our stack."""
    from nemo_rl_core.pipeline.algorithms import GRPO

    return tuple(stage.name for stage in GRPO.stages if stage.due is None)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line
        )
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def machine_line() -> str:
    return (
        f"cpu: {cpu_model()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC"
    )


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def command_line() -> str:
    """The exact command that ran this script, as it would be typed in the repo root."""
    return " ".join([".venv/bin/python", *map(shlex.quote, sys.argv)])


def record(heading: str, table: str, reading: str, smoke: bool) -> None:
    """Append a section to RESULTS.md (never in smoke mode: smoke runs only keep the script
    working, their figures mean nothing)."""
    if smoke:
        print("smoke mode: not recorded in bench/RESULTS.md")
        return
    section = (
        f"\n## {heading}\n\nCommand: `{command_line()}`; {machine_line()}.\n\n"
        f"```\n{table.rstrip()}\n```\n\n{reading.strip()}\n"
    )
    with RESULTS.open("a") as out:
        out.write(section)
    print(f"recorded in {RESULTS}")


@contextmanager
def local_s3_bucket(log_dir: Path) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with one fresh bucket; yields ``s3://bucket``.

    Credentials and endpoint go into ``AWS_*`` environment variables, which is how a flow
    finds S3 without a Prefect block (restored on exit)."""
    import boto3

    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in [*env, "AWS_ENDPOINT_URL_S3"]}
    os.environ.update(env)
    try:
        with running_moto_server(log_dir / "moto_server.log") as endpoint:
            os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
            yield f"s3://{bucket}"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def flow_iteration_times(manifests: "list[Manifest]") -> list[dict]:
    """Per iteration after the first, from each iteration's manifest: ``{"total": s,
    stage: wall s, stage + "_compute": s, "update": s, "start"/"end": its first and last
    moment (``time.time()``)}``.

    A stage's wall time runs from the previous commit (the previous stage, or the previous
    iteration's ``checkpoint``) to its own; the first iteration has no start and is left
    out (it also pays model loading and engine start-up). ``update`` is the policy update
    inside the train stage (the rest is the checkpoint commit)."""
    timings = []
    for previous, manifest in zip(manifests, manifests[1:], strict=False):
        stages = manifest.stages
        last = committed_at(previous.stages["checkpoint"])
        end = committed_at(stages["checkpoint"])
        timing = {"total": end - last, "start": last, "end": end}
        for stage in every_iteration_stages():
            committed = committed_at(stages[stage])
            timing[stage] = committed - last
            timing[f"{stage}_compute"] = stages[stage].metrics["seconds"]
            last = committed
        timing["update"] = stages["train"].metrics["policy_update_seconds"]
        timings.append(timing)
    return timings


def flow_curves(manifests: "list[Manifest]") -> dict[str, list[float]]:
    """Per iteration, the first included: mean reward (``reward``) and mean generated
    length (``response_tokens``), from each iteration's manifest metrics."""
    return {
        "reward": [m.stages["reward"].metrics["mean_reward"] for m in manifests],
        "response_tokens": [
            m.stages["generate"].metrics["mean_generation_length"] for m in manifests
        ],
    }


def committed_at(entry: "StageEntry") -> float:
    return entry.finished_at.timestamp()


def batch_overrides(prompts: int, generations: int, iterations: int) -> list[str]:
    """Config overrides for ``prompts x generations`` sequences, one optimizer step each
    (in micro batches of at most 8)."""
    sequences = prompts * generations
    return [
        f"grpo.num_prompts_per_step={prompts}",
        f"grpo.num_generations_per_prompt={generations}",
        f"policy.train_global_batch_size={sequences}",
        f"policy.train_micro_batch_size={min(8, sequences)}",
        f"grpo.max_num_steps={iterations}",
    ]


@contextmanager
def _timed(timing: dict[str, float], stage: str):
    start = time.perf_counter()
    yield
    timing[stage] = time.perf_counter() - start


def plain_loop(
    config_path: str, overrides: list[str], iterations: int
) -> tuple[list[dict], list[float]]:
    """Per-iteration stage seconds (after the first; with ``start``/``end`` moments as
    ``flow_iteration_times``) and mean rewards of GRPO as a plain loop over the core step
    functions: batches in memory, the policy warm, the generation
    engine refit from the policy's state dict. The warm objects are built by the flow's
    own ``RunRuntime``, so both paths load the same models the same way."""
    from nemo_rl_core.algorithms import grpo as core
    from nemo_rl_core.algorithms.prompt_batches import take_prompts
    from nemo_rl_core.algorithms.rollout_generation import generate_rollouts
    from nemo_rl_core.algorithms.scoring import score_rollouts
    from nemo_rl_core.algorithms.training import train_policy
    from nemo_rl_core.models.local_models import resolve_model
    from nemo_rl_core.pipeline.algorithms import GRPO
    from nemo_rl_core.pipeline.runtime import RunRuntime
    from nemo_rl_core.storage.handles import RunRef

    config = core.load_master_config(config_path, overrides)
    model_dir = resolve_model(config.policy.model_name)
    runtime = RunRuntime(RunRef("memory://plain", "plain"), GRPO, config, model_dir)
    timings, rewards = [], []
    # The engine is held for the whole loop: it is refit here from the policy's memory.
    with closing(runtime), runtime.generation(0) as engine:
        tokenizer, envs = runtime.tokenizer, runtime.task_to_env
        policy = runtime.policy(0)
        state = runtime.dataloader_state(0)
        for iteration in range(iterations):
            timing: dict[str, float] = {"start": time.time()}
            start = time.perf_counter()
            with _timed(timing, "prompts"):
                batch, state = take_prompts(runtime.dataloader, config, state)
            with _timed(timing, "generate"):
                if iteration:
                    engine.update_weights_from_state_dict(policy.state_dict_for_refit())
                rollouts, _ = generate_rollouts(engine, batch, tokenizer, envs, config, iteration)
            with _timed(timing, "reward"):
                scored, metrics = score_rollouts(rollouts, envs, config)
            with _timed(timing, "logprob"):
                train_data = core.compute_logprobs(policy, scored, tokenizer, config)
            with _timed(timing, "advantage"):
                train_data, _ = core.compute_advantages(train_data, config)
            with _timed(timing, "train"):
                train_policy(policy, train_data, core.build_loss_fn(config), config, iteration)
            timing["checkpoint"] = 0.0
            timing["total"] = time.perf_counter() - start
            timing["end"] = time.time()
            rewards.append(metrics["mean_reward"])
            if iteration:
                timings.append(timing)
    return timings, rewards


def grpo_manifests(
    config_path: str, overrides: list[str], iterations: int, storage_root: str
) -> "tuple[list[Manifest], float]":
    """The GRPO flow run in this process (Prefect's ephemeral API) on ``storage_root``: its
    iterations' manifests, and when the flow returned (``time.time()``: after its teardown,
    which stops its rank groups)."""
    from flows.grpo import grpo
    from nemo_rl_core.storage.run_storage import RunStorage

    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    grpo(config_path=config_path, overrides=overrides, run_id=run_id, storage_root=storage_root)
    returned_at = time.time()
    storage = RunStorage(storage_root, run_id)
    return [storage.read_manifest(i) for i in range(iterations)], returned_at


def flow_run(
    config_path: str, overrides: list[str], iterations: int, storage_root: str
) -> tuple[list[dict], dict[str, list[float]]]:
    """Per-iteration stage seconds (after the first) and ``flow_curves`` of the GRPO flow,
    run in this process (Prefect's ephemeral API) on ``storage_root``."""
    manifests, _ = grpo_manifests(config_path, overrides, iterations, storage_root)
    return flow_iteration_times(manifests), flow_curves(manifests)
