"""Scale model: predicted GRPO seconds per iteration against the number of workers a
split stage fans out over and the number of ranks that train, calibrated from figures
measured here.

Each stage's wall time in one process is fitted as ``a + b * n`` (n sequences per
iteration) from flow runs at two sizes: ``a`` is the fixed cost (a task run, the handoff,
the manifest commit), ``b`` the cost per sequence; every stage boundary moves its batch
through storage (the bytes each stage wrote, read back once, at ``bandwidth`` MB/s).
Spreading a stage is not free, and the model charges what the spreading mechanisms cost
as measured:

- **Fan-out** (``orchestration.fan_out``, issue 30 item 2): generate and logprob cut into
  ``g`` shards, each a task run on a warm stage worker of a pool, run at once, then merged
  by the stage's own task. It costs ``placed`` (one placed stage's fixed cost: submitting
  the task run, a worker taking it, reading its inputs from the object store, committing;
  measured by ``bench/placement.py``, see ``PLACED_STAGE_S``) plus the merge (a second
  ``a``), and divides ``b * n`` by ``g``.
- **SPMD training** (``cluster.num_nodes x gpus_per_node`` = G ranks, issue 30 item 3):
  the train stage starts its ranks with torchrun every iteration; each loads the model and
  optimizer from the last checkpoint, trains on its slice, and rank 0 gathers and commits.
  It costs ``launch`` per iteration (measured here: the train stage with 2 ranks against
  one process, at the small size) and divides ``b_train * n`` by ``G * efficiency``
  (efficiency is an assumption: 2 gloo ranks on 2 shared CPU cores cannot measure it).

Whatever does not shrink is the floor: fixed costs, the unsplit CPU stages (prompts,
reward, advantage), the storage handoff, the fan-out and launch costs; and the run lease
allows one iteration of an experiment at a time (synchronous GRPO), so the floor bounds
throughput until generation overlaps training (asynchronous GRPO).

Run:   .venv/bin/python bench/scale_model.py                  (32 and 128 sequences)
       .venv/bin/python bench/scale_model.py --bandwidth-mb-s 180   (an S3 endpoint)
Smoke: .venv/bin/python bench/scale_model.py --smoke
"""

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    SMOKE_OVERRIDES,
    TINY_CONFIG,
    batch_overrides,
    every_iteration_stages,
    flow_run,
    machine_line,
    median,
    record,
)

GENERATIONS = 4
FANNED_OUT = ("generate", "logprob")  # split over g stage workers (orchestration.fan_out)
TRAIN = "train"  # split over G ranks (cluster.num_nodes x gpus_per_node)
SPMD_RANKS = 2  # what this machine can run to measure a launch: one rank per core

PLACED_STAGE_S = 0.28
"""Fixed seconds a stage pays on a warm stage worker of a pool: a placed task run's cost
less its compute (submit, pickup, start, the run's own reads and commits), 0.27-0.28 s at
64 and 256 sequences in `bench/placement.py`'s per-part split (bench/RESULTS.md "Warm stage
workers", 28 Nov 01:11-01:16 UTC, quiet machine, two rounds). It was 1.4 s on 27 Nov, at
load 9-10 and before the per-process Prefect clients of issue 30."""


@dataclass(frozen=True)
class StageFit:
    fixed_s: float  # a
    per_sequence_s: float  # b
    bytes_per_sequence: float  # what the stage wrote to storage, per sequence


@dataclass(frozen=True)
class SpreadCosts:
    """What spreading costs per iteration, measured: a fanned-out stage's placement, a
    train stage's torchrun launch across ranks."""

    placed_s: float
    spmd_launch_s: float
    efficiency: float  # data-parallel, of the train ranks' compute (assumed)


def fit_line(sizes: tuple[int, int], seconds: tuple[float, float]) -> tuple[float, float]:
    """``(a, b)`` of the line through two measurements; ``a`` floored at 0."""
    b = max(0.0, (seconds[1] - seconds[0]) / (sizes[1] - sizes[0]))
    return max(0.0, seconds[1] - b * sizes[1]), b


def stage_bytes(root: Path) -> dict[str, int]:
    """Bytes each stage wrote in the run's second iteration (the first also loads)."""
    (iteration,) = root.glob("runs/*/iter_000001")
    return {
        stage.name: sum(f.stat().st_size for f in stage.rglob("*") if f.is_file())
        for stage in iteration.iterdir()
        if stage.is_dir()
    }


def disk_bandwidth_mb_s(folder: Path, megabytes: int = 64) -> float:
    """Write then read back ``megabytes`` in ``folder``: the file:// store's MB/s."""
    path, data = folder / "bandwidth.bin", bytes(megabytes << 20)
    start = time.perf_counter()
    path.write_bytes(data)
    path.read_bytes()
    return 2 * megabytes / (time.perf_counter() - start)


def predict(
    fits: dict[str, StageFit],
    n: int,
    workers: int,
    ranks: int,
    bandwidth_mb_s: float,
    costs: SpreadCosts,
) -> float:
    """Seconds per iteration of ``n`` sequences with generate and logprob fanned out over
    ``workers`` stage workers and train on ``ranks`` ranks, each stage's batch handed over
    through storage."""
    total = 0.0
    for stage, fit in fits.items():
        compute = fit.per_sequence_s * n
        fixed = fit.fixed_s
        if stage in FANNED_OUT and workers > 1:
            compute /= workers
            fixed += costs.placed_s + fit.fixed_s  # the shards' placement, then the merge
        elif stage == TRAIN and ranks > 1:
            compute /= ranks * costs.efficiency
            fixed += costs.spmd_launch_s
        handoff = fit.bytes_per_sequence * n / (bandwidth_mb_s * 1e6)
        total += fixed + compute + handoff
    return total


def break_even(fit: StageFit, split: int, cost_s: float, efficiency: float = 1.0) -> float:
    """Sequences per iteration from which splitting a stage ``split`` ways (at
    ``efficiency``) saves more than ``cost_s``; inf where it never does."""
    saved_per_sequence = fit.per_sequence_s * (1 - 1 / (split * efficiency))
    return cost_s / saved_per_sequence if saved_per_sequence > 0 else float("inf")


def spmd_launch_seconds(size: int, iterations: int, smoke: bool, one_process: float) -> float:
    """The train stage's seconds on ``SPMD_RANKS`` ranks (torchrun, gloo) less its seconds
    in one process at the same size: what a launch across ranks adds per iteration."""
    with tempfile.TemporaryDirectory() as tmp:
        generations = min(GENERATIONS, size)
        overrides = batch_overrides(size // generations, generations, iterations)
        # each rank's share of the global batch holds whole micro batches
        micro = min(8, max(1, size // SPMD_RANKS))
        overrides += [
            f"cluster.gpus_per_node={SPMD_RANKS}",
            f"policy.train_micro_batch_size={micro}",
        ]
        overrides += SMOKE_OVERRIDES if smoke else []
        timings, _ = flow_run(TINY_CONFIG, overrides, iterations, f"file://{tmp}")
    ranks = median([t[TRAIN] for t in timings])
    print(f"{size} sequences, train on {SPMD_RANKS} ranks: {ranks:.2f} s", flush=True)
    return max(0.0, ranks - one_process)


def calibrate(
    sizes: tuple[int, int], iterations: int, smoke: bool
) -> tuple[dict[str, StageFit], float, float]:
    """Stage fits from flow runs at both sizes, this disk's bandwidth, and the train
    stage's seconds at the small size."""
    seconds: dict[str, list[float]] = {stage: [] for stage in every_iteration_stages()}
    written: dict[str, int] = {}
    bandwidth = 0.0
    generations = min(GENERATIONS, *sizes)
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            overrides = batch_overrides(n // generations, generations, iterations)
            overrides += SMOKE_OVERRIDES if smoke else []
            timings, _ = flow_run(TINY_CONFIG, overrides, iterations, f"file://{tmp}")
            for stage in seconds:
                seconds[stage].append(median([t[stage] for t in timings]))
            written = stage_bytes(Path(tmp))
            bandwidth = disk_bandwidth_mb_s(Path(tmp))
        print(f"{n} sequences: {sum(s[-1] for s in seconds.values()):.2f} s/iteration", flush=True)
    fits = {}
    for stage, (small, large) in seconds.items():
        fixed, per_sequence = fit_line(sizes, (small, large))
        fits[stage] = StageFit(fixed, per_sequence, written.get(stage, 0) / sizes[1])
    return fits, bandwidth, seconds[TRAIN][0]


def format_model(
    fits: dict[str, StageFit], n: int, bandwidth: float, costs: SpreadCosts
) -> tuple[str, str]:
    """The fitted stages and spreading costs, the predicted table, where scaling stops."""
    lines = [f"{'stage':>10}{'fixed s':>10}{'ms/seq':>9}{'KB/seq':>9}"]
    for stage, fit in fits.items():
        lines.append(
            f"{stage:>10}{fit.fixed_s:>10.3f}{fit.per_sequence_s * 1e3:>9.3f}"
            f"{fit.bytes_per_sequence / 1e3:>9.2f}"
        )
    lines.append(
        f"spreading: a placed shard {costs.placed_s:.2f} s (bench/placement.py), a "
        f"train launch on ranks {costs.spmd_launch_s:.2f} s (measured here), data-parallel "
        f"efficiency {costs.efficiency:.0%} (assumed)"
    )
    rank_counts, worker_counts = (1, 2, 4, 8), (1, 2, 4, 8, 16)
    lines += ["", f"predicted s/iteration at {n} sequences, storage {bandwidth:.0f} MB/s:"]
    lines.append(f"{'fan-out':>12}" + "".join(f"{f'{r} ranks':>10}" for r in rank_counts))
    for workers in worker_counts:
        cells = "".join(
            f"{predict(fits, n, workers, r, bandwidth, costs):>10.2f}" for r in rank_counts
        )
        lines.append(f"{workers:>12}{cells}")
    one = predict(fits, n, 1, 1, bandwidth, costs)
    best = min(
        (predict(fits, n, w, r, bandwidth, costs), w, r) for w in worker_counts for r in rank_counts
    )
    unbounded = 10**9
    # the floor: workers and ranks without limit, each lever used only where it pays
    floor, workers, ranks = min(
        (predict(fits, n, w, r, bandwidth, costs), w, r)
        for w in (1, unbounded)
        for r in (1, unbounded)
    )
    handoff = sum(f.bytes_per_sequence for f in fits.values()) * n / (bandwidth * 1e6)
    fixed = sum(f.fixed_s for f in fits.values())
    spread = sum(costs.placed_s + fits[s].fixed_s for s in FANNED_OUT) * (workers > 1)
    spread += costs.spmd_launch_s * (ranks > 1)
    rest = floor - fixed - handoff - spread
    used = [name for name, on in (("fan-out", workers > 1), ("ranks", ranks > 1)) if on]
    lines.append(
        f"best in the table: {best[0]:.2f} s (fan-out {best[1]}, {best[2]} ranks) of "
        f"{one:.2f} s unspread"
    )
    lines.append(
        f"floor (unbounded workers, ranks where they pay; using {' and '.join(used) or 'neither'}"
        f"): {floor:.2f} s = fixed {fixed:.2f} + spreading {spread:.2f} + stages' compute "
        f"left {rest:.2f} + storage handoff {handoff:.3f}; best speedup {one / floor:.1f}x"
    )
    for stage in FANNED_OUT:
        cost = costs.placed_s + fits[stage].fixed_s
        lines.append(
            f"{stage} fanned out 2 / 16 ways pays from "
            f"{break_even(fits[stage], 2, cost):.0f} / {break_even(fits[stage], 16, cost):.0f} "
            "sequences per iteration"
        )
    lines.append(
        f"train on 2 / 8 ranks pays from "
        f"{break_even(fits[TRAIN], 2, costs.spmd_launch_s, costs.efficiency):.0f} / "
        f"{break_even(fits[TRAIN], 8, costs.spmd_launch_s, costs.efficiency):.0f} "
        "sequences per iteration"
    )
    reading = (
        "Stages fitted from flow runs at two sizes (`a + b*n`); a fanned-out stage pays a "
        "placed shard's fixed cost and a merge, a train stage on ranks pays a torchrun "
        "launch per iteration (both measured, sources in `bench/scale_model.py`). Absolute "
        "seconds are this CPU's tiny model; what carries over is where each lever starts "
        "to pay (the break-even sizes scale with a stage's seconds per sequence, so a "
        "larger model reaches them at fewer sequences) and the floor."
    )
    return "\n".join(lines), reading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="2 and 4 sequences, HF generation, ranks launched once"
    )
    parser.add_argument("--sizes", nargs=2, type=int, default=[32, 128])
    parser.add_argument("--iterations", type=int, default=3, help="per size; first is warm-up")
    parser.add_argument("--predict-at", type=int, default=512, help="sequences per iteration")
    parser.add_argument("--bandwidth-mb-s", type=float, help="default: this disk, measured")
    parser.add_argument("--efficiency", type=float, default=0.85, help="data-parallel")
    parser.add_argument(
        "--placed-stage-s", type=float, default=PLACED_STAGE_S, help="a placed shard's cost"
    )
    parser.add_argument(
        "--spmd-launch-s", type=float, help=f"default: measured on {SPMD_RANKS} ranks here"
    )
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.iterations = [2, 4], 2
    print(machine_line(), flush=True)
    fits, disk, small_train = calibrate(tuple(args.sizes), args.iterations, args.smoke)
    launch = args.spmd_launch_s
    if launch is None:
        # the smoke launches its ranks once: each launch is ~10 s of start-up on 2 cores
        iterations = 1 if args.smoke else args.iterations
        launch = spmd_launch_seconds(args.sizes[0], iterations, args.smoke, small_train)
    costs = SpreadCosts(args.placed_stage_s, launch, args.efficiency)
    table, reading = format_model(fits, args.predict_at, args.bandwidth_mb_s or disk, costs)
    print(table)
    record(
        "Scale model: seconds per iteration vs fan-out and training ranks (issue 30)",
        table,
        reading,
        args.smoke,
    )


if __name__ == "__main__":
    main()
