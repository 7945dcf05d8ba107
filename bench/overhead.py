"""Orchestration overhead: the same GRPO iterations as a plain loop, as the Prefect flow on
local storage, and as the Prefect flow on S3, with the servers on cores of their own.

(a) ``plain``: one process calls the core step functions of ``nemo_rl_core.algorithms.grpo``
    directly; batches stay in memory, the policy stays warm, and the generation engine is
    refit from the policy's state dict (built by the same ``RunRuntime`` the flow uses).
(b) ``flow-file``: ``flows.grpo`` in this process, against a real Prefect server, with the
    Arrow handoff, a manifest commit per stage and a committed checkpoint per iteration on
    ``file://``.
(c) ``flow-s3``: the same flow with its storage root on ``s3://`` (the stack's moto).

The server side is the local stack as a deployment has it (``infra/stack.sh start postgres
s3 server``: ``prefect server start`` on PostgreSQL 15, and moto as the object store),
pinned with ``taskset`` to ``--server-cores``; this process (the plain loop, the flow and
its reward workers) is pinned to ``--flow-cores`` before torch loads. So the flow pays on
its own core what a training machine pays (Prefect's client, the handoff, the commits),
and the servers' CPU, which a deployment spends elsewhere, does not slow its stages.

All three run the same config, seed and tiny model. Each repeat runs a, b, c back to back
so machine load hits them alike; the first iteration of every run (model load, engine
start-up) is left out and the figures are medians over the remaining iterations of all
repeats. Flow stage times come from the manifests (see ``bench/common.py``); CPU seconds
per iteration of each process group (this process and its children; the API server;
PostgreSQL; moto) come from a sampler (``bench/process_cpu.py``) read at the same moments.

Run:   .venv/bin/python bench/overhead.py            (64 and 256 sequences, 2 repeats of 5 iterations)
Smoke: .venv/bin/python bench/overhead.py --smoke    (batch 2x2, 2 iterations, once)
"""

import argparse
import os
import tempfile
import time

from common import (
    SMOKE_OVERRIDES,
    TINY_CONFIG,
    batch_overrides,
    every_iteration_stages,
    flow_run,
    machine_line,
    median,
    plain_loop,
    record,
)
from local_stack import LocalStack, running_stack
from process_cpu import SAMPLE_S, CpuClock, pid_file_group, this_process_tree

VARIANTS = ("plain", "flow-file", "flow-s3")
SERVER_SIDE = ("postgres", "s3", "server")  # infra/stack.sh components: no worker
CPU_COLUMNS = {
    "client": "this process and its children: the loop or the flow, its reward workers",
    "api": "the Prefect API server (`prefect server start`)",
    "postgres": "PostgreSQL, the API server's database",
    "s3": "moto, the S3 server",
}


def cpu_clock(stack: LocalStack, sampler_cores: set[int] | None) -> CpuClock:
    """Samplers of this process tree and of each server of ``stack``, sampling from
    ``sampler_cores`` (the servers': off the core the loop and the flow are measured on)."""
    run = stack.state_dir / "run"
    return CpuClock(
        {
            "client": this_process_tree(),
            "api": pid_file_group(str(run / "server.pid")),
            "postgres": pid_file_group(str(stack.state_dir / "pgdata" / "postmaster.pid")),
            "s3": pid_file_group(str(run / "s3.pid")),
        },
        cores=sampler_cores,
    )


def measure(
    prompts: int,
    generations: int,
    iterations: int,
    repeats: int,
    roots: dict[str, str],
    extra_overrides: list[str],
    clock: CpuClock,
) -> dict[str, dict]:
    """Timings and CPU seconds of every variant, a/b/c interleaved per repeat; rewards of
    the last repeat."""
    overrides = batch_overrides(prompts, generations, iterations) + extra_overrides
    results: dict[str, dict] = {
        v: {"timings": [], "rewards": [], "cpu": {group: [] for group in CPU_COLUMNS}}
        for v in VARIANTS
    }
    for repeat in range(repeats):
        for variant in VARIANTS:
            if variant == "plain":
                timings, rewards = plain_loop(TINY_CONFIG, overrides, iterations)
            else:
                timings, curves = flow_run(TINY_CONFIG, overrides, iterations, roots[variant])
                rewards = curves["reward"]
            time.sleep(3 * SAMPLE_S)  # a sample after the last iteration's end
            for timing in timings:
                for group, seconds in results[variant]["cpu"].items():
                    seconds.append(clock.between(group, timing["start"], timing["end"]))
            results[variant]["timings"] += timings
            results[variant]["rewards"] = rewards
            print(
                f"[batch {prompts}x{generations} repeat {repeat + 1}/{repeats}] {variant}: "
                f"{median([t['total'] for t in timings]):.2f} s/iteration, client CPU "
                f"{median(results[variant]['cpu']['client'][-len(timings) :]):.2f} s/iteration",
                flush=True,
            )
    return results


def own_cost(timing: dict) -> float:
    """What the flow adds to its stages' compute in one iteration: task runs, reading and
    writing the handoff, the manifest commits (the checkpoint commit is in ``train``'s
    compute; ``checkpoint_commit`` says how much)."""
    return timing["total"] - sum(timing[f"{s}_compute"] for s in every_iteration_stages())


def checkpoint_commit(timing: dict) -> float:
    """The part of the train stage's compute that commits the checkpoint (0 in the loop)."""
    return timing["train_compute"] - timing["update"] if "update" in timing else 0.0


def format_table(label: str, results: dict[str, dict]) -> str:
    """Per iteration: seconds, each stage's seconds and share, the flow's own cost, and the
    CPU seconds of each process group; then the ratios to plain."""
    stages = every_iteration_stages()
    head = (
        f"{'variant':<11}{'s/iter':>7}"
        + "".join(f"{s:>11}" for s in stages)
        + f"{'own':>7}{'ckpt':>6}  | CPU s/iter:"
        + "".join(f"{c:>9}" for c in CPU_COLUMNS)
    )
    lines = [f"batch {label}", head]
    plain_total = median([t["total"] for t in results["plain"]["timings"]])
    plain_cpu = median(results["plain"]["cpu"]["client"])
    for variant, result in results.items():
        timings = result["timings"]
        total = median([t["total"] for t in timings])
        cells = "".join(
            f"{median([t[s] for t in timings]):>7.2f} {median([t[s] for t in timings]) / total:>3.0%}"
            for s in stages
        )
        flow = variant != "plain"
        own = f"{median([own_cost(t) for t in timings]):>7.3f}" if flow else f"{'-':>7}"
        ckpt = f"{median([checkpoint_commit(t) for t in timings]):>6.3f}" if flow else f"{'-':>6}"
        cpu = "".join(f"{median(result['cpu'][c]):>9.3f}" for c in CPU_COLUMNS)
        lines.append(f"{variant:<11}{total:>7.2f}{cells}{own}{ckpt}  |            {cpu}")
    for variant in VARIANTS[1:]:
        timings = results[variant]["timings"]
        total = median([t["total"] for t in timings])
        client = median(results[variant]["cpu"]["client"])
        lines.append(
            f"ratio {variant}/plain = {total / plain_total:.2f}  (the flow's own cost "
            f"{median([own_cost(t) for t in timings]):.3f} s per iteration, the checkpoint "
            f"commit {median([checkpoint_commit(t) for t in timings]):.3f} s more; client CPU "
            f"{client - plain_cpu:+.3f} s per iteration over the loop's, ratio "
            f"{client / plain_cpu:.2f})"
        )
    rewards = {v: [round(r, 3) for r in results[v]["rewards"]] for v in VARIANTS}
    lines.append(f"mean reward per iteration (last repeat): {rewards}")
    return "\n".join(lines)


def profile_flow(
    prompts: int, generations: int, iterations: int, root: str, top: int, out_path: str | None
) -> str:
    """cProfile of one flow run (this process only: the servers' work shows up as the time
    its callers wait on them), the ``top`` entries by cumulative time; the whole profile
    goes to ``out_path`` (for ``pstats``) when given."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    flow_run(TINY_CONFIG, batch_overrides(prompts, generations, iterations), iterations, root)
    profiler.disable()
    if out_path:
        profiler.dump_stats(out_path)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def cores(spec: str) -> set[int]:
    """``0`` or ``0,2-3`` as a set of core numbers."""
    found: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="batch 2x2, 2 iterations, once")
    parser.add_argument(
        "--batches", nargs="+", default=["8x8", "16x16"], help="PROMPTSxGENERATIONS sizes"
    )
    parser.add_argument("--iterations", type=int, default=5, help="per run; the first is warm-up")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--flow-cores", default="0", help="cores of this process (taskset -c)")
    parser.add_argument(
        "--server-cores", default="1", help="cores of the API server, PostgreSQL and moto"
    )
    parser.add_argument(
        "overrides", nargs="*", help="config key=value overrides for all three variants"
    )
    parser.add_argument(
        "--profile",
        type=int,
        metavar="TOP",
        help="instead: cProfile one flow-file run of the last batch, print TOP entries",
    )
    parser.add_argument("--profile-out", help="with --profile: write the whole profile here")
    args = parser.parse_args()
    if args.smoke:
        args.batches, args.iterations, args.repeats = ["2x2"], 2, 1
    pinned = (os.cpu_count() or 1) > 1
    if pinned:  # before torch loads: its thread pool and vLLM's thread binding follow it
        os.sched_setaffinity(0, cores(args.flow_cores))
    with running_stack(SERVER_SIDE, args.server_cores if pinned else None) as stack:
        os.environ.update(stack.env_vars)  # before prefect loads: its API and the S3 endpoint
        s3_root = f"s3://{stack.bucket}/overhead"
        with tempfile.TemporaryDirectory() as tmp:
            roots = {"flow-file": f"file://{tmp}/store", "flow-s3": s3_root}
            if args.profile:
                prompts, generations = (int(n) for n in args.batches[-1].split("x"))
                profile = profile_flow(
                    prompts,
                    generations,
                    args.iterations,
                    roots["flow-file"],
                    args.profile,
                    args.profile_out,
                )
                print(profile)
                return
            try:
                sampler_cores = cores(args.server_cores) if pinned else None
                run(args, pinned, roots, cpu_clock(stack, sampler_cores))
            finally:
                flush_prefect_logs()


def flush_prefect_logs() -> None:
    """Send the log lines Prefect still holds while its API server is up (the stack stops
    next; at exit they would fail to reach it)."""
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)  # what APILogHandler.flush does, without a handler


def run(args: argparse.Namespace, pinned: bool, roots: dict[str, str], clock: CpuClock) -> None:
    import torch  # after common (its OpenMP note) and after pinning this process

    placement = (
        f"this process on cores {args.flow_cores}; the API server, PostgreSQL and moto on "
        f"cores {args.server_cores} (taskset)"
        if pinned
        else "one core: nothing pinned"
    )
    placement += f"; torch threads {torch.get_num_threads()}"
    print(f"{machine_line()}; {placement}", flush=True)
    placement += f"; load average {os.getloadavg()[0]:.1f} at the start"
    tables = []
    with clock.running():
        for batch in args.batches:
            prompts, generations = (int(n) for n in batch.split("x"))
            extra = (SMOKE_OVERRIDES if args.smoke else []) + args.overrides
            results = measure(
                prompts, generations, args.iterations, args.repeats, roots, extra, clock
            )
            tables.append(format_table(f"{batch} = {prompts * generations} sequences", results))
            print(tables[-1], flush=True)
    record(
        "Orchestration overhead, servers on their own core: plain loop vs Prefect flow on "
        "file:// and S3 (issue 30)",
        "\n\n".join([placement, *tables]),
        "Per iteration, medians over the iterations after the first of every repeat. Stage "
        "cells: seconds and share of the iteration; flow stage times include reading "
        "inputs, writing outputs and the manifest, and the Prefect task run around the "
        "compute. 'own': the flow's own cost, its wall time minus its stages' compute (task "
        "runs, handoff, manifest commits); 'ckpt': the checkpoint commit inside the train "
        "stage's compute (the loop commits none). CPU columns: "
        + "; ".join(f"'{c}' {what}" for c, what in CPU_COLUMNS.items())
        + ". The server side is `infra/stack.sh start postgres s3 server`; the load average "
        "in the command line is the one at the end.",
        args.smoke,
    )


if __name__ == "__main__":
    main()
