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
  the train stage runs on a warm rank group (``flows/rank_group.py``): torchrun starts the
  ranks once, each loads the model and optimizer, and every iteration orders the stage from
  rank 0, which hands the order to every rank; each reads its inputs, trains on its slice,
  and rank 0 gathers and commits. It costs ``step`` per iteration (the order, the ranks'
  reads, the gather and commit: the train stage on ranks less in one process, at the same
  size, in the iterations after the first) and ``launch`` (starting the group: the first
  iteration's train stage on ranks less in one process, less a step; and stopping it: the
  flow's teardown on ranks less in one process), measured here on ``SPMD_RANKS`` gloo
  ranks, and divides ``b_train * n`` by ``G * efficiency`` (efficiency is an assumption: 2
  gloo ranks on 2 shared CPU cores cannot measure it). Where the launch falls depends on
  the devices, as ``flows.placed_nodes.between_orders`` decides: on devices of its own
  (*dedicated*: a pool no other stage is placed on, or this machine's CPU ranks) the group
  stays up for the flow run and the launch is paid once per ``--iterations``; where it
  shares them (*colocated*: another stage on its pool) the group ends after each order and
  every iteration pays a launch. Both are predicted. (This machine's ranks on CUDA, HF or
  Megatron, stay up and offload to host memory between orders: a host-device copy each way
  that no GPU here can measure.)

Whatever does not shrink is the floor: fixed costs, the unsplit CPU stages (prompts,
reward, advantage), the storage handoff, the fan-out and rank-group costs; and the run lease
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
    committed_at,
    every_iteration_stages,
    flow_iteration_times,
    grpo_manifests,
    machine_line,
    median,
    record,
)

GENERATIONS = 4
FANNED_OUT = ("generate", "logprob")  # split over g stage workers (orchestration.fan_out)
TRAIN = "train"  # split over G ranks (cluster.num_nodes x gpus_per_node)
SPMD_RANKS = 2  # what this machine can run to measure a rank group: one rank per core
FLOW_RUN_ITERATIONS = 100  # a dedicated rank group's launch is paid once per flow run

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
    """What spreading costs, measured: a fanned-out stage's placement; a train stage's warm
    rank group, per order and per launch (starting and stopping it)."""

    placed_s: float
    spmd_step_s: float
    spmd_launch_s: float
    efficiency: float  # data-parallel, of the train ranks' compute (assumed)
    iterations: int = FLOW_RUN_ITERATIONS  # of a flow run, over which one launch is spread

    def train_ranks_s(self, colocated: bool) -> float:
        """Seconds per iteration a train stage on ranks adds to its own fixed cost: its
        group's step, and a launch every iteration where the ranks share their devices
        (``colocated``: the group ends after each order), else one per flow run."""
        launches = 1.0 if colocated else 1.0 / self.iterations
        return self.spmd_step_s + self.spmd_launch_s * launches


@dataclass(frozen=True)
class CalibrationRun:
    """One calibration flow run: each stage's median wall seconds in the iterations after the
    first, the train stage's wall seconds in the first (where a rank group starts), and the
    seconds from the last commit to the flow's return (its teardown: where the group stops)."""

    stages: dict[str, float]
    first_train_s: float
    teardown_s: float


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
    colocated: bool = False,
) -> float:
    """Seconds per iteration of ``n`` sequences with generate and logprob fanned out over
    ``workers`` stage workers and train on ``ranks`` ranks (``colocated``: sharing their
    devices with other stages), each stage's batch handed over through storage."""
    total = 0.0
    for stage, fit in fits.items():
        compute = fit.per_sequence_s * n
        fixed = fit.fixed_s
        if stage in FANNED_OUT and workers > 1:
            compute /= workers
            fixed += costs.placed_s + fit.fixed_s  # the shards' placement, then the merge
        elif stage == TRAIN and ranks > 1:
            compute /= ranks * costs.efficiency
            fixed += costs.train_ranks_s(colocated)
        handoff = fit.bytes_per_sequence * n / (bandwidth_mb_s * 1e6)
        total += fixed + compute + handoff
    return total


def break_even(fit: StageFit, split: int, cost_s: float, efficiency: float = 1.0) -> float:
    """Sequences per iteration from which splitting a stage ``split`` ways (at
    ``efficiency``) saves more than ``cost_s``; inf where it never does."""
    saved_per_sequence = fit.per_sequence_s * (1 - 1 / (split * efficiency))
    return cost_s / saved_per_sequence if saved_per_sequence > 0 else float("inf")


def calibration_run(n: int, iterations: int, smoke: bool, ranks: int, root: Path) -> CalibrationRun:
    """A GRPO flow run of ``n`` sequences per iteration on ``root``, training on ``ranks``
    ranks (more than one: a warm rank group of this machine's ranks, gloo)."""
    generations = min(GENERATIONS, n)
    overrides = batch_overrides(n // generations, generations, iterations)
    if ranks > 1:
        # each rank's share of the global batch holds whole micro batches
        micro = min(8, max(1, n // ranks))
        overrides += [f"cluster.gpus_per_node={ranks}", f"policy.train_micro_batch_size={micro}"]
    overrides += SMOKE_OVERRIDES if smoke else []
    manifests, returned_at = grpo_manifests(TINY_CONFIG, overrides, iterations, f"file://{root}")
    timings = flow_iteration_times(manifests)
    stages = every_iteration_stages()
    first = manifests[0].stages
    before_train = stages[stages.index(TRAIN) - 1]
    return CalibrationRun(
        {stage: median([t[stage] for t in timings]) for stage in stages},
        committed_at(first[TRAIN]) - committed_at(first[before_train]),
        returned_at - committed_at(manifests[-1].stages["checkpoint"]),
    )


@dataclass(frozen=True)
class RankGroupCosts:
    """A warm rank group's seconds per order, to start and to stop, and the runs they came
    from (``measured``, as the output says it)."""

    step_s: float
    start_s: float
    stop_s: float
    measured: str


def rank_group_costs(one: CalibrationRun, ranks: CalibrationRun, n: int) -> RankGroupCosts:
    """What the run on ranks adds to the run in one process, both at ``n`` sequences: the
    train stage in the later iterations (a step), in the first (a start, less a step), and
    the flow's teardown (a stop)."""
    step = max(0.0, ranks.stages[TRAIN] - one.stages[TRAIN])
    measured = (
        f"{n} sequences, train on {SPMD_RANKS} ranks (one process): a step "
        f"{ranks.stages[TRAIN]:.2f} s ({one.stages[TRAIN]:.2f}), the first "
        f"{ranks.first_train_s:.2f} s ({one.first_train_s:.2f}), the flow's teardown "
        f"{ranks.teardown_s:.2f} s ({one.teardown_s:.2f})"
    )
    return RankGroupCosts(
        step,
        max(0.0, ranks.first_train_s - one.first_train_s - step),
        max(0.0, ranks.teardown_s - one.teardown_s),
        measured,
    )


def calibrate(
    sizes: tuple[int, int], iterations: int, smoke: bool, measure_ranks: bool
) -> tuple[dict[str, StageFit], float, RankGroupCosts | None]:
    """Stage fits from flow runs at both sizes, this disk's bandwidth, and (``measure_ranks``)
    the rank group's costs from a run on ranks at the small size, right after its run in one
    process (side by side)."""
    seconds: dict[str, list[float]] = {stage: [] for stage in every_iteration_stages()}
    written: dict[str, int] = {}
    bandwidth = 0.0
    group = None
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            one = calibration_run(n, iterations, smoke, 1, Path(tmp))
            written = stage_bytes(Path(tmp))
            bandwidth = disk_bandwidth_mb_s(Path(tmp))
        for stage in seconds:
            seconds[stage].append(one.stages[stage])
        print(f"{n} sequences: {sum(one.stages.values()):.2f} s/iteration", flush=True)
        if measure_ranks and group is None:
            with tempfile.TemporaryDirectory() as tmp:
                ranks = calibration_run(n, iterations, smoke, SPMD_RANKS, Path(tmp))
            group = rank_group_costs(one, ranks, n)
            print(group.measured, flush=True)
    fits = {}
    for stage, (small, large) in seconds.items():
        fixed, per_sequence = fit_line(sizes, (small, large))
        fits[stage] = StageFit(fixed, per_sequence, written.get(stage, 0) / sizes[1])
    return fits, bandwidth, group


MODES = {False: "dedicated", True: "colocated"}  # the train ranks' devices, shared or not


def prediction_table(
    fits: dict[str, StageFit], n: int, bandwidth: float, costs: SpreadCosts, colocated: bool
) -> list[str]:
    """Predicted seconds per iteration, fan-out by training ranks, for one device mode."""
    rank_counts, worker_counts = (1, 2, 4, 8), (1, 2, 4, 8, 16)
    lines = [f"{'fan-out':>12}" + "".join(f"{f'{r} ranks':>10}" for r in rank_counts)]
    for workers in worker_counts:
        cells = "".join(
            f"{predict(fits, n, workers, r, bandwidth, costs, colocated):>10.2f}"
            for r in rank_counts
        )
        lines.append(f"{workers:>12}{cells}")
    best = min(
        (predict(fits, n, w, r, bandwidth, costs, colocated), w, r)
        for w in worker_counts
        for r in rank_counts
    )
    lines.append(f"best: {best[0]:.2f} s (fan-out {best[1]}, {best[2]} ranks)")
    return lines


def floor_line(
    fits: dict[str, StageFit], n: int, bandwidth: float, costs: SpreadCosts, colocated: bool
) -> str:
    """The floor of one device mode: workers and ranks without limit, each lever used only
    where it pays, and what it is made of."""
    unbounded = 10**9
    one = predict(fits, n, 1, 1, bandwidth, costs)
    floor, workers, ranks = min(
        (predict(fits, n, w, r, bandwidth, costs, colocated), w, r)
        for w in (1, unbounded)
        for r in (1, unbounded)
    )
    handoff = sum(f.bytes_per_sequence for f in fits.values()) * n / (bandwidth * 1e6)
    fixed = sum(f.fixed_s for f in fits.values())
    spread = sum(costs.placed_s + fits[s].fixed_s for s in FANNED_OUT) * (workers > 1)
    spread += costs.train_ranks_s(colocated) * (ranks > 1)
    rest = floor - fixed - handoff - spread
    used = [name for name, on in (("fan-out", workers > 1), ("ranks", ranks > 1)) if on]
    return (
        f"{MODES[colocated]} floor (unbounded workers, ranks where they pay; using "
        f"{' and '.join(used) or 'neither'}): {floor:.2f} s = fixed {fixed:.2f} + spreading "
        f"{spread:.2f} + stages' compute left {rest:.2f} + storage handoff {handoff:.3f}; "
        f"best speedup {one / floor:.1f}x"
    )


def format_model(
    fits: dict[str, StageFit],
    n: int,
    bandwidth: float,
    costs: SpreadCosts,
    group: RankGroupCosts,
) -> tuple[str, str]:
    """The fitted stages and spreading costs, the predicted tables of both device modes,
    where scaling stops."""
    lines = [f"{'stage':>10}{'fixed s':>10}{'ms/seq':>9}{'KB/seq':>9}"]
    for stage, fit in fits.items():
        lines.append(
            f"{stage:>10}{fit.fixed_s:>10.3f}{fit.per_sequence_s * 1e3:>9.3f}"
            f"{fit.bytes_per_sequence / 1e3:>9.2f}"
        )
    lines.append(
        f"spreading: a placed shard {costs.placed_s:.2f} s (bench/placement.py); a warm rank "
        f"group {costs.spmd_step_s:.2f} s a step and {costs.spmd_launch_s:.2f} s a launch "
        f"(start and stop); data-parallel efficiency {costs.efficiency:.0%} "
        "(assumed)"
    )
    lines.append(
        f"{group.measured}: step {group.step_s:.2f} s, start {group.start_s:.2f} s, stop "
        f"{group.stop_s:.2f} s"
    )
    lines.append(
        f"train ranks dedicated: +{costs.train_ranks_s(False):.2f} s/iteration (the launch "
        f"once per {costs.iterations}-iteration flow run); colocated: "
        f"+{costs.train_ranks_s(True):.2f} s/iteration (a launch every iteration)"
    )
    for colocated, mode in MODES.items():
        lines += [
            "",
            f"predicted s/iteration at {n} sequences, storage {bandwidth:.0f} MB/s, "
            f"train ranks {mode}:",
        ]
        lines += prediction_table(fits, n, bandwidth, costs, colocated)
    lines += ["", f"unspread: {predict(fits, n, 1, 1, bandwidth, costs):.2f} s"]
    lines += [floor_line(fits, n, bandwidth, costs, colocated) for colocated in MODES]
    for stage in FANNED_OUT:
        cost = costs.placed_s + fits[stage].fixed_s
        lines.append(
            f"{stage} fanned out 2 / 16 ways pays from "
            f"{break_even(fits[stage], 2, cost):.0f} / {break_even(fits[stage], 16, cost):.0f} "
            "sequences per iteration"
        )
    for colocated, mode in MODES.items():
        cost = costs.train_ranks_s(colocated)
        lines.append(
            f"{mode}: train on 2 / 8 ranks pays from "
            f"{break_even(fits[TRAIN], 2, cost, costs.efficiency):.0f} / "
            f"{break_even(fits[TRAIN], 8, cost, costs.efficiency):.0f} sequences per iteration"
        )
    reading = (
        "Stages fitted from flow runs at two sizes (`a + b*n`); a fanned-out stage pays a "
        "placed shard's fixed cost and a merge; a train stage on ranks pays its warm rank "
        "group's step every iteration and a launch (start and stop) once per flow run on "
        "dedicated devices, every iteration where the ranks share devices with other stages "
        "(all measured, sources in `bench/scale_model.py`). Absolute seconds are this CPU's "
        "tiny model; what carries over is where each lever starts to pay (the break-even "
        "sizes scale with a stage's seconds per sequence, so a larger model reaches them at "
        "fewer sequences) and the floor."
    )
    return "\n".join(lines), reading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="2 and 4 sequences, HF generation, 2 iterations"
    )
    parser.add_argument("--sizes", nargs=2, type=int, default=[32, 128])
    parser.add_argument(
        "--calibration-iterations", type=int, default=3, help="per run; the first is warm-up"
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=FLOW_RUN_ITERATIONS,
        help="of the predicted flow run: a dedicated rank group's launch is spread over them",
    )
    parser.add_argument("--predict-at", type=int, default=512, help="sequences per iteration")
    parser.add_argument("--bandwidth-mb-s", type=float, help="default: this disk, measured")
    parser.add_argument("--efficiency", type=float, default=0.85, help="data-parallel")
    parser.add_argument(
        "--placed-stage-s", type=float, default=PLACED_STAGE_S, help="a placed shard's cost"
    )
    measured = f"default: measured on {SPMD_RANKS} ranks here (both given: no run on ranks)"
    parser.add_argument("--spmd-step-s", type=float, help=f"a rank group's step; {measured}")
    parser.add_argument(
        "--spmd-launch-s", type=float, help=f"a rank group's start and stop; {measured}"
    )
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.calibration_iterations = [2, 4], 2
    print(machine_line(), flush=True)
    measure_ranks = args.spmd_step_s is None or args.spmd_launch_s is None
    fits, disk, group = calibrate(
        tuple(args.sizes), args.calibration_iterations, args.smoke, measure_ranks
    )
    if group is None:  # both given
        given = "rank group as given (--spmd-step-s, --spmd-launch-s as its start)"
        group = RankGroupCosts(args.spmd_step_s, args.spmd_launch_s, 0.0, given)
    costs = SpreadCosts(
        args.placed_stage_s,
        group.step_s if args.spmd_step_s is None else args.spmd_step_s,
        group.start_s + group.stop_s if args.spmd_launch_s is None else args.spmd_launch_s,
        args.efficiency,
        args.iterations,
    )
    table, reading = format_model(fits, args.predict_at, args.bandwidth_mb_s or disk, costs, group)
    print(table)
    record(
        "Scale model: seconds per iteration vs fan-out and training ranks (issue 30)",
        table,
        reading,
        args.smoke,
    )


if __name__ == "__main__":
    main()
