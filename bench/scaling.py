"""Scaling: seconds per GRPO iteration of the flow as prompts x generations grows.

The flow (file:// storage, tiny model) runs a few iterations at each size; the first
iteration of each run is warm-up and left out. The exponent ``k`` of ``time ~ n^k`` is the
least-squares slope in log-log space, for the whole iteration and for each stage: ``k``
near 1 is linear; below 1 means fixed per-iteration costs still dominate the small sizes.

Run:   .venv/bin/python bench/scaling.py            (8, 32, 128, 512 sequences)
Smoke: .venv/bin/python bench/scaling.py --smoke    (2 and 4 sequences, 2 iterations)
"""

import argparse
import math
import tempfile
from pathlib import Path

from common import (
    PLOTS,
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


def fitted_exponent(sizes: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(size)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(t) for t in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def plot(sizes: list[int], per_stage: dict[str, list[float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, seconds in per_stage.items():
        ax.plot(sizes, seconds, marker="o", linewidth=2.5 if name == "total" else 1, label=name)
    ax.plot(
        sizes,
        [per_stage["total"][0] * s / sizes[0] for s in sizes],
        "k:",
        label="linear from the smallest",
    )
    ax.set(xscale="log", yscale="log", xlabel="sequences per iteration (prompts x generations)")
    ax.set(ylabel="seconds per iteration (median)", title="GRPO flow, tiny Llama, CPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def format_table(sizes: list[int], per_stage: dict[str, list[float]]) -> str:
    """Seconds per iteration and per stage at each size, the step ratios and the exponents."""
    lines = [
        f"{'sequences':>9}{'s/iter':>9}{'ratio':>7}"
        + "".join(f"{s:>11}" for s in every_iteration_stages())
    ]
    for i, n in enumerate(sizes):
        ratio = per_stage["total"][i] / per_stage["total"][i - 1] if i else 1.0
        cells = "".join(f"{per_stage[s][i]:>11.2f}" for s in every_iteration_stages())
        lines.append(f"{n:>9}{per_stage['total'][i]:>9.2f}{ratio:>7.2f}{cells}")
    exponents = {name: fitted_exponent(sizes, s) for name, s in per_stage.items()}
    lines.append(
        "fitted exponent k (time ~ n^k): "
        + ", ".join(f"{name} {k:.2f}" for name, k in exponents.items())
    )
    return "\n".join(lines)


def main() -> None:
    import torch  # after common: see its OpenMP note

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2 and 4 sequences, 2 iterations")
    parser.add_argument("--sequences", nargs="+", type=int, default=[8, 32, 128, 512])
    parser.add_argument("--iterations", type=int, default=4, help="per size; the first is warm-up")
    args = parser.parse_args()
    if args.smoke:
        args.sequences, args.iterations = [2, 4], 2
    print(f"{machine_line()}, torch threads {torch.get_num_threads()}", flush=True)
    generations = min(GENERATIONS, min(args.sequences))
    per_stage: dict[str, list[float]] = {name: [] for name in ("total", *every_iteration_stages())}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sequences:
            overrides = batch_overrides(n // generations, generations, args.iterations)
            overrides += SMOKE_OVERRIDES if args.smoke else []
            timings, _ = flow_run(TINY_CONFIG, overrides, args.iterations, f"file://{tmp}")
            for name in per_stage:
                per_stage[name].append(median([t[name] for t in timings]))
            print(f"{n} sequences: {per_stage['total'][-1]:.2f} s/iteration", flush=True)
        table = format_table(args.sequences, per_stage)
        print(table)
        PLOTS.mkdir(exist_ok=True)
        png = (Path(tmp) if args.smoke else PLOTS) / "scaling.png"
        plot(args.sequences, per_stage, str(png))
    record(
        "Scaling: GRPO flow seconds per iteration vs sequences per iteration (issue 8)",
        f"{table}\nplot: bench/plots/{png.name}",
        f"Each size: prompts x {generations} generations, max 32 new tokens, "
        f"{args.iterations} iterations of which the first is warm-up; 'ratio' is the time "
        "ratio to the previous size (the sizes grow 4x).",
        args.smoke,
    )


if __name__ == "__main__":
    main()
