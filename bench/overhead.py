"""Orchestration overhead: the same GRPO iterations as a plain loop, as the Prefect flow on
local storage, and as the Prefect flow on a local S3 server (moto).

(a) ``plain``: one process calls the core step functions of ``nemo_rl_core.algorithms.grpo``
    directly; batches stay in memory, the policy stays warm, and the generation engine is
    refit from the policy's state dict (built by the same ``RunRuntime`` the flow uses).
(b) ``flow-file``: ``flows.grpo`` (Prefect's ephemeral API in this process), Parquet handoff
    and a committed checkpoint per iteration on ``file://``.
(c) ``flow-s3``: the same flow with its storage root on ``s3://`` (moto on 127.0.0.1).

All three run the same config, seed and tiny model. Each repeat runs a, b, c back to back
so machine load hits them alike; the first iteration of every run (model load, engine
start-up) is left out and the figures are medians over the remaining iterations of all
repeats. Flow stage times come from the manifests (see ``bench/common.py``). The CPU
time of Prefect's API server (the ephemeral one) and of the S3 server (moto), child
processes on the same cores, is measured around each flow run: it is what slows the flow's
stage compute next to the loop's (both run elsewhere in a real deployment).

Run:   .venv/bin/python bench/overhead.py            (batches 64 and 256, 2 repeats of 4 iterations)
Smoke: .venv/bin/python bench/overhead.py --smoke    (batch 4, 2 iterations, once)
"""

import argparse
import contextlib
import tempfile
from pathlib import Path

import psutil
from common import (
    SMOKE_OVERRIDES,
    TINY_CONFIG,
    batch_overrides,
    every_iteration_stages,
    flow_run,
    local_s3_bucket,
    machine_line,
    median,
    plain_loop,
    record,
)

VARIANTS = ("plain", "flow-file", "flow-s3")


SERVERS = {"server_cpu": "prefect.server", "s3_cpu": "moto_server"}
"""What each server column measures: the child process whose command line holds the mark
(Prefect's ephemeral API server, which the first flow run starts; the moto S3 server)."""


def child_cpu_seconds(mark: str) -> float | None:
    """CPU seconds used so far by the child process whose command line holds ``mark``;
    None while there is none."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(mark in arg for arg in child.cmdline()):
                times = child.cpu_times()
                return times.user + times.system
    return None


def start_api_server() -> None:
    """Start Prefect's ephemeral API server before anything is timed: the flow run that would
    start it cannot have its server CPU measured, and with one repeat that left the column
    without a figure (``nan``)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.api_healthcheck()


def measure(
    prompts: int,
    generations: int,
    iterations: int,
    repeats: int,
    scratch: Path,
    s3_root: str,
    extra_overrides: list[str],
) -> dict[str, dict]:
    """Timings of every variant, a/b/c interleaved per repeat; rewards of the last repeat."""
    overrides = batch_overrides(prompts, generations, iterations) + extra_overrides
    results: dict[str, dict] = {
        v: {"timings": [], "rewards": [], **{column: [] for column in SERVERS}} for v in VARIANTS
    }
    start_api_server()
    for repeat in range(repeats):
        for variant in VARIANTS:
            if variant == "plain":
                timings, rewards = plain_loop(TINY_CONFIG, overrides, iterations)
            else:
                root = f"file://{scratch}/store" if variant == "flow-file" else s3_root
                before = {column: child_cpu_seconds(mark) for column, mark in SERVERS.items()}
                timings, curves = flow_run(TINY_CONFIG, overrides, iterations, root)
                rewards = curves["reward"]
                for column, mark in SERVERS.items():
                    if before[column] is not None:  # None: an external server
                        spent = (child_cpu_seconds(mark) or 0.0) - before[column]
                        results[variant][column].append(spent / iterations)
            results[variant]["timings"] += timings
            results[variant]["rewards"] = rewards
            print(
                f"[batch {prompts}x{generations} repeat {repeat + 1}/{repeats}] {variant}: "
                f"{median([t['total'] for t in timings]):.2f} s/iteration",
                flush=True,
            )
    return results


def format_table(label: str, results: dict[str, dict]) -> str:
    """Seconds per iteration, each stage's median seconds and share, and the ratios to plain."""
    head = f"{'variant':<11}{'s/iter':>8}" + "".join(f"{s:>11}" for s in every_iteration_stages())
    lines = [f"batch {label}", head]
    plain_total = median([t["total"] for t in results["plain"]["timings"]])
    for variant, result in results.items():
        timings = result["timings"]
        total = median([t["total"] for t in timings])
        cells = "".join(
            f"{median([t[s] for t in timings]):>7.2f} {median([t[s] for t in timings]) / total:>3.0%}"
            for s in every_iteration_stages()
        )
        lines.append(f"{variant:<11}{total:>8.2f}{cells}")
    for variant in VARIANTS[1:]:
        timings = results[variant]["timings"]
        compute = median(
            [sum(t[f"{s}_compute"] for s in every_iteration_stages()) for t in timings]
        )
        total = median([t["total"] for t in timings])
        server = median(results[variant]["server_cpu"])
        s3_server = median(results[variant]["s3_cpu"])
        lines.append(
            f"ratio {variant}/plain = {total / plain_total:.2f}  "
            f"(stage compute {compute:.2f} s, orchestration + handoff {total - compute:.2f} s "
            f"per iteration; CPU s per iteration of the Prefect API server {server:.2f}, "
            f"of the S3 server {s3_server:.2f})"
        )
    rewards = {v: [round(r, 3) for r in results[v]["rewards"]] for v in VARIANTS}
    lines.append(f"mean reward per iteration (last repeat): {rewards}")
    return "\n".join(lines)


def profile_flow(prompts: int, generations: int, iterations: int, root: str, top: int) -> str:
    """cProfile of one flow run (this process only: the ephemeral API server's own work
    shows up as the time its callers wait on HTTP), the ``top`` entries by cumulative time."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    flow_run(TINY_CONFIG, batch_overrides(prompts, generations, iterations), iterations, root)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> None:
    import torch  # after common: see its OpenMP note

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="batch 2x2, 2 iterations, once")
    parser.add_argument(
        "--batches", nargs="+", default=["8x8", "16x16"], help="PROMPTSxGENERATIONS sizes"
    )
    parser.add_argument("--iterations", type=int, default=4, help="per run; the first is warm-up")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "overrides", nargs="*", help="config key=value overrides for all three variants"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument(
        "--profile",
        type=int,
        metavar="TOP",
        help="instead: cProfile one flow-file run of the last batch, print TOP entries",
    )
    args = parser.parse_args()
    if args.profile:
        prompts, generations = (int(n) for n in args.batches[-1].split("x"))
        with tempfile.TemporaryDirectory() as tmp:
            print(
                profile_flow(prompts, generations, args.iterations, f"file://{tmp}", args.profile)
            )
        return
    if args.smoke:
        args.batches, args.iterations, args.repeats = ["2x2"], 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{machine_line()}, torch threads {torch.get_num_threads()}", flush=True)
    tables = []
    with tempfile.TemporaryDirectory() as tmp, local_s3_bucket(Path(tmp)) as s3_root:
        for batch in args.batches:
            prompts, generations = (int(n) for n in batch.split("x"))
            extra = (SMOKE_OVERRIDES if args.smoke else []) + args.overrides
            results = measure(
                prompts, generations, args.iterations, args.repeats, Path(tmp), s3_root, extra
            )
            tables.append(format_table(f"{batch} = {prompts * generations} sequences", results))
            print(tables[-1], flush=True)
    record(
        "Orchestration overhead: plain loop vs Prefect flow on file:// and S3 (issue 8)",
        "\n\n".join(tables),
        "Stage cells are median seconds and share of the iteration; flow stage times include "
        "reading inputs, writing outputs and the manifest, and the Prefect task run around "
        "the compute; the flow's train stage also commits the iteration's checkpoint; the "
        "API and S3 servers' CPU time is per iteration of a whole flow run (the API "
        "server's start left out).",
        args.smoke,
    )


if __name__ == "__main__":
    main()
