"""Stages on pools of warm stage workers against one process (issue 30, item 1): iteration
wall time of the same config with and without ``cluster.placement``, side by side on one
fresh local stack (``infra/``: PostgreSQL, Prefect server, moto S3, the process worker).

Both variants are flow runs of ``grpo/manual`` on the stack's process worker, storing the
run on S3. "one process" runs every stage in that flow run; "two pools" places stages as
the config says (``grpo_math_tiny_pools.yaml``: generate and reward on ``rollout-pool``,
logprob and train on ``train-pool``), each pool served by one stage worker
(``infra/stack.sh start worker@POOL``) started before the runs, which keeps its models from
one iteration to the next.

Iteration wall time = from one iteration's checkpoint commit to the next's, read from the
manifests; iteration 0 pays the model loads on both sides and is shown apart. The variants
alternate (one process, two pools, one process, ...) so that the machine's load falls on
both alike.

Three sizes, on the same stack: the config as it is ("tiny": 4 sequences of 8 new tokens, an
iteration of about a second, where a placed task run's fixed cost dominates), "64 seq"
(8 prompts x 8 generations of up to 64 new tokens, one train step of 64: an iteration of a
few seconds) and "256 seq" (32 prompts x 8 generations, one train step of 256: an iteration
of ten seconds or so, nearer the 13-17 s the issue saw, still far below a real model's).

Below the table, each size's placed task runs split into parts (``placed_parts``), from the
task runs' state timestamps on the server: what a placement costs per task run.

Run:   .venv/bin/python bench/placement.py                       (6 steps, 2 rounds, every size)
       .venv/bin/python bench/placement.py --config examples/configs/grpo_math_tiny.yaml \\
           --place generate=rollout-pool --place reward=rollout-pool \\
           --place logprob=train-pool --place train=train-pool
       .venv/bin/python bench/placement.py --size tiny           (one size)
Smoke: .venv/bin/python bench/placement.py --smoke               (2 steps, 1 round, not recorded)
"""

import argparse
import statistics
import sys
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from common import every_iteration_stages, flow_iteration_times, record

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "examples/configs/grpo_math_tiny_pools.yaml"
STAGES = ("generate", "reward", "logprob", "train")
SIZES = {
    "tiny": [],
    "64 seq": [
        "grpo.num_prompts_per_step=8",
        "grpo.num_generations_per_prompt=8",
        "policy.generation.max_new_tokens=64",
        "policy.train_global_batch_size=64",
        "policy.train_micro_batch_size=16",
        "policy.logprob_batch_size=16",
    ],
    "256 seq": [
        "grpo.num_prompts_per_step=32",
        "grpo.num_generations_per_prompt=8",
        "policy.generation.max_new_tokens=64",
        "policy.train_global_batch_size=256",
        "policy.train_micro_batch_size=16",
        "policy.logprob_batch_size=16",
    ],
}


PARTS = ("submit", "pickup", "start", "in run", "compute", "complete")
PARTS_NOTE = (
    "Parts of a placed task run, from its states' timestamps on the Prefect server and its "
    "stages' commits in the manifests: 'submit' from the commit before it (the waiter seeing "
    "the previous task run end and reading its outputs, then Prefect's submission: the "
    "task-scheduling block, parameters to S3) to the task run's creation; 'pickup' to "
    "Pending (a worker took it and read its parameters); 'start' to Running (the worker's "
    "task engine starting: its context, the task run's name set on the server); 'in run' from Running to its last stage's commit, less "
    "'compute' (its stages' own seconds): the credentials block, the heartbeat, the stages' "
    "manifest reads, outputs and commits; 'complete' from that commit to Completed; 'fixed': "
    "all but 'compute'."
)


def placed_parts(stack: Any, flow_run_id: str, manifests: list) -> list[dict[str, float]]:
    """Where the seconds of each placed task run of iterations 1.. went (``PARTS_NOTE``)."""
    order = list(every_iteration_stages())
    task_runs = stack.api(
        "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}}
    )
    parts = []
    for task_run in task_runs:
        if "@" not in task_run["task_key"]:  # a stage of the flow run's own process
            continue
        chain, iteration = task_run["name"].rsplit("-it", 1)
        if int(iteration) == 0:  # the model loads
            continue
        names = chain.split("+")
        stages = manifests[int(iteration)].stages
        states = stack.api("GET", f"/task_run_states/?task_run_id={task_run['id']}")
        at = {
            state["type"]: datetime.fromisoformat(state["timestamp"]).timestamp()
            for state in states
        }
        created = datetime.fromisoformat(task_run["created"]).timestamp()
        before = stages[order[order.index(names[0]) - 1]].finished_at.timestamp()
        committed = stages[names[-1]].finished_at.timestamp()
        compute = sum(stages[name].metrics["seconds"] for name in names)
        parts.append(
            {
                "submit": created - before,
                "pickup": at["PENDING"] - created,
                "start": at["RUNNING"] - at["PENDING"],
                "in run": committed - at["RUNNING"] - compute,
                "compute": compute,
                "complete": at["COMPLETED"] - committed,
            }
        )
    return parts


def measure_run(
    stack: Any, deployment_id: str, config: str, run_id: str, overrides: list[str]
) -> dict:
    """One flow run of ``grpo/manual`` with ``overrides`` (``stack``: a ``LocalStack``); the
    wall seconds of its iterations, of its iteration 0 and of the whole flow run, and the
    parts of its placed task runs."""
    from nemo_rl_core.storage.run_storage import RunStorage

    parameters = {"run_id": run_id, "config_path": config, "overrides": overrides}
    flow_run_id = stack.start_flow_run(deployment_id, parameters)
    final = stack.wait_for_flow_run(flow_run_id, timeout=7200)
    if final["state_type"] != "COMPLETED":
        raise RuntimeError(
            f"{run_id}: {final['state_name']}: {stack.flow_run_logs(flow_run_id)[-5:]}"
        )
    storage = RunStorage(f"s3://{stack.bucket}", run_id, storage_options=stack.storage_options)
    manifests = [storage.read_manifest(i) for i in storage.iterations()]
    timings = flow_iteration_times(manifests)
    started, ended = (
        datetime.fromisoformat(final[key]).timestamp() for key in ("start_time", "end_time")
    )
    first_commit = manifests[0].stages["checkpoint"].finished_at.timestamp()
    return {
        "flow_run_s": ended - started,
        "first_s": first_commit - started,
        "iteration_s": [t["total"] for t in timings],
        "stage_s": {s: [t[s] for t in timings] for s in STAGES},
        "compute_s": [sum(t[f"{s}_compute"] for s in STAGES) for t in timings],
        "parts": placed_parts(stack, flow_run_id, manifests),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument(
        "--place", action="append", default=[], help="STAGE=POOL (default: the config's)"
    )
    parser.add_argument("--steps", type=int, default=None, help="default 6 (smoke 2)")
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (smoke 1)")
    parser.add_argument(
        "--size", action="append", choices=sorted(SIZES), help="default: every size"
    )
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    sizes = args.size or (["tiny"] if args.smoke else list(SIZES))
    steps = args.steps or (2 if args.smoke else 6)
    rounds = args.rounds or (1 if args.smoke else 2)
    common = [f"grpo.max_num_steps={steps}"]
    placed = [f"++cluster.placement.{item}" for item in args.place]
    pools = sorted({item.split("=", 1)[1] for item in args.place}) or ["rollout-pool", "train-pool"]
    # Without --place the config places its stages itself: the one-process run drops that.
    unplaced = [] if placed else ["~cluster.placement"]
    variants = {
        (size, side): [*common, *SIZES[size], *overrides]
        for size in sizes
        for side, overrides in (("one process", unplaced), ("two pools", placed))
    }

    sys.path.insert(0, str(ROOT / "infra"))
    from local_stack import running_stack

    results: dict[tuple[str, str], list[dict]] = {variant: [] for variant in variants}
    with running_stack() as stack:
        deployment_id = stack.deploy_all()["grpo/manual"]
        for pool in pools:
            stack.restart_worker(pool)
        for round_index in range(rounds):
            for (size, side), overrides in variants.items():
                tag = f"{size}-{side}".replace(" ", "-")
                run_id = f"placement-{tag}-{round_index}-{uuid.uuid4().hex[:6]}"
                measured = measure_run(stack, deployment_id, args.config, run_id, overrides)
                results[size, side].append(measured)
                print(size, side, round_index, measured["iteration_s"], flush=True)

    def pooled(variant: tuple[str, str], key: str) -> list[float]:
        return [value for result in results[variant] for value in result[key]]

    lines = [
        f"{'size':7} {'variant':12} {'iter s (median)':>15} {'vs one process':>14} "
        f"{'iteration 0 s':>13} {'flow run s':>10} {'compute s':>9}  "
        + " ".join(f"{s + ' s':>10}" for s in STAGES)
    ]
    for size, side in variants:
        base = statistics.median(pooled((size, "one process"), "iteration_s"))
        runs = results[size, side]
        median = statistics.median(pooled((size, side), "iteration_s"))
        first = statistics.median(r["first_s"] for r in runs)
        wall = statistics.median(r["flow_run_s"] for r in runs)
        compute = statistics.median(pooled((size, side), "compute_s"))
        stages = " ".join(
            f"{statistics.median(v for r in runs for v in r['stage_s'][s]):10.2f}" for s in STAGES
        )
        lines.append(
            f"{size:7} {side:12} {median:15.2f} {median / base:13.2f}x {first:13.1f} "
            f"{wall:10.1f} {compute:9.2f}  {stages}"
        )
    lines += ["", "placed task runs, median seconds of each part (iterations 1..):"]
    lines.append(
        f"{'size':7} {'runs':>4} " + " ".join(f"{part:>8}" for part in PARTS) + f" {'fixed':>8}"
    )
    for size in sizes:
        parts = [part for r in results[size, "two pools"] for part in r["parts"]]
        if not parts:
            continue
        medians = {part: statistics.median(p[part] for p in parts) for part in PARTS}
        fixed = statistics.median(sum(p[k] for k in PARTS if k != "compute") for p in parts)
        lines.append(
            f"{size:7} {len(parts):4} "
            + " ".join(f"{medians[part]:8.2f}" for part in PARTS)
            + f" {fixed:8.2f}"
        )
    table = "\n".join(lines)
    print(table)
    reading = (
        f"{args.config}, {steps} steps, {rounds} round(s) of the variants alternating, on one "
        "fresh local stack (moto S3; the Prefect server, PostgreSQL and the workers share the "
        "machine's cores with the stages). 'iter s': median wall seconds from one iteration's "
        "checkpoint commit to the next's, iterations 1.. of every round; 'iteration 0 s' holds "
        "the model loads (the workers' first task, the flow process's first stage); "
        "'flow run s': submitted to completed; 'compute s': median of an iteration's "
        "generate, reward, logprob and train compute seconds (manifest metrics: reading the "
        "inputs, a generation engine's refit, the stage's work). Stage columns: median wall seconds of each stage "
        "from the previous commit to its own (for a placed stage: submitting its task run, a "
        "worker taking it, reading its inputs from S3, computing, committing, the waiter "
        "seeing it complete; consecutive stages of one pool are one task run, so its "
        "stages' columns split that task run's time). "
        + " ".join(f"'{size}' adds: {' '.join(SIZES[size])}." for size in sizes if SIZES[size])
        + " "
        + PARTS_NOTE
    )
    record(
        "Warm stage workers: two-pool iteration vs one process, same config (issue 30)",
        table,
        reading,
        args.smoke,
    )


if __name__ == "__main__":
    main()
