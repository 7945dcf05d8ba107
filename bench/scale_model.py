"""Scale model: predicted GRPO seconds per iteration against the number of generate workers
and of GPUs for the GPU stages, calibrated from stage times measured here.

Each stage's wall time is fitted as ``a + b * n`` (n sequences per iteration) from flow runs
at two sizes: ``a`` is the fixed cost (a task run, the Parquet handoff, loading), ``b`` the
cost per sequence. Placed on many machines, generation splits its ``b * n`` over ``g``
workers, logprob and train over ``G`` data-parallel GPUs (at ``efficiency``), and every
stage boundary then moves its batch through object storage: the bytes each stage wrote,
measured from the run's storage, read back once, at ``bandwidth`` MB/s. What is left when
g and G grow is the scaling floor: fixed costs, the CPU stages, the storage handoff; and
the run lease allows one iteration of an experiment at a time (synchronous GRPO), so the
floor bounds throughput until generation overlaps training (asynchronous GRPO).

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
SPLIT_BY_WORKERS = ("generate",)
SPLIT_BY_GPUS = ("logprob", "train")


@dataclass(frozen=True)
class StageFit:
    fixed_s: float  # a
    per_sequence_s: float  # b
    bytes_per_sequence: float  # what the stage wrote to storage, per sequence


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
    gpus: int,
    bandwidth_mb_s: float,
    efficiency: float,
) -> float:
    """Seconds per iteration of ``n`` sequences with ``workers`` generate workers and
    ``gpus`` GPUs for logprob and train, each stage's batch handed over through storage."""
    total = 0.0
    for stage, fit in fits.items():
        per_sequence = fit.per_sequence_s * n
        if stage in SPLIT_BY_WORKERS:
            per_sequence /= workers
        elif stage in SPLIT_BY_GPUS:
            per_sequence /= gpus * efficiency if gpus > 1 else 1
        handoff = fit.bytes_per_sequence * n / (bandwidth_mb_s * 1e6)
        total += fit.fixed_s + per_sequence + handoff
    return total


def calibrate(sizes: tuple[int, int], iterations: int, smoke: bool) -> tuple[dict, float]:
    """Stage fits from flow runs at both sizes, and this disk's bandwidth."""
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
    return fits, bandwidth


def format_model(
    fits: dict[str, StageFit], n: int, bandwidth: float, efficiency: float
) -> tuple[str, str]:
    """The fitted stages, the predicted table, and where scaling stops."""
    lines = [f"{'stage':>10}{'fixed s':>10}{'ms/seq':>9}{'KB/seq':>9}"]
    for stage, fit in fits.items():
        lines.append(
            f"{stage:>10}{fit.fixed_s:>10.3f}{fit.per_sequence_s * 1e3:>9.3f}"
            f"{fit.bytes_per_sequence / 1e3:>9.2f}"
        )
    gpu_counts, worker_counts = (1, 2, 4, 8), (1, 2, 4, 8, 16)
    lines += ["", f"predicted s/iteration at {n} sequences, storage {bandwidth:.0f} MB/s:"]
    lines.append(f"{'gen workers':>12}" + "".join(f"{f'{g} GPU':>9}" for g in gpu_counts))
    for workers in worker_counts:
        cells = "".join(
            f"{predict(fits, n, workers, g, bandwidth, efficiency):>9.2f}" for g in gpu_counts
        )
        lines.append(f"{workers:>12}{cells}")
    floor = predict(fits, n, 10**9, 10**9, bandwidth, efficiency)
    one = predict(fits, n, 1, 1, bandwidth, efficiency)
    handoff = sum(f.bytes_per_sequence for f in fits.values()) * n / (bandwidth * 1e6)
    fixed = sum(f.fixed_s for f in fits.values())
    serial = floor - fixed - handoff
    lines.append(
        f"floor (unbounded workers and GPUs): {floor:.2f} s = fixed {fixed:.2f} + CPU stages "
        f"{serial:.2f} + storage handoff {handoff:.3f}; best speedup {one / floor:.1f}x"
    )
    reading = (
        f"Fitted from flow runs at two sizes (`a + b*n` per stage), GPU stages split at "
        f"{efficiency:.0%} data-parallel efficiency. Absolute seconds are this CPU's tiny "
        "model; the shape is what carries over: once the split stages shrink, the fixed "
        "per-stage costs, the unsplit CPU stages (reward, advantage) and the storage handoff "
        "are the floor, and one lease per experiment runs one iteration at a time."
    )
    return "\n".join(lines), reading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2 and 4 sequences, HF generation")
    parser.add_argument("--sizes", nargs=2, type=int, default=[32, 128])
    parser.add_argument("--iterations", type=int, default=3, help="per size; first is warm-up")
    parser.add_argument("--predict-at", type=int, default=512, help="sequences per iteration")
    parser.add_argument("--bandwidth-mb-s", type=float, help="default: this disk, measured")
    parser.add_argument("--efficiency", type=float, default=0.85, help="data-parallel")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.iterations = [2, 4], 2
    print(machine_line(), flush=True)
    fits, disk = calibrate(tuple(args.sizes), args.iterations, args.smoke)
    bandwidth = args.bandwidth_mb_s or disk
    table, reading = format_model(fits, args.predict_at, bandwidth, args.efficiency)
    print(table)
    record(
        "Scale model: seconds per iteration vs generate workers and GPUs (issue 20)",
        table,
        reading,
        args.smoke,
    )


if __name__ == "__main__":
    main()
