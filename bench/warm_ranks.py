"""The SFT train stage across 2 "nodes" x 1 rank (two stage workers of one pool, c10d on
127.0.0.1, gloo), or (``--layout local``) on 2 ranks of this machine launched by the flow
(``cluster.gpus_per_node=2``, not placed), a warm rank group (this checkout) against one
torchrun launch and model load per iteration (``--before``: a checkout of the code before
warm ranks of that layout, e.g. ``git archive 8f9662b | tar -x -C /tmp/before`` for nodes,
``git archive 1474e1d | tar -x -C /tmp/before-local`` for local), side by side on one
Prefect server.

Columns: seconds per iteration (median over rounds of each run's median), the train stage's
own seconds (its manifest ``seconds``: the step and the checkpoint commit, median), the flow
run's wall time, and each run's iteration gaps.

Both variants run the same command (``python -m flows sft`` of ``sft_tiny.yaml`` with
``cluster.num_nodes=2``, ``cluster.placement.train`` on a pool of two fresh stage workers of
their own checkout; local: ``cluster.gpus_per_node=2``, nothing placed), in turn, for ``--rounds`` rounds. Seconds per iteration = from one
iteration's train commit to the next's, read from the manifests (iteration 0 pays the first
launch on both sides and is left out); the flow run's wall time is shown too.

``--before-name`` names the ``--before`` row when that checkout is another warm one (an
earlier commit), so the two rows compare warm rank groups.

Run:   .venv/bin/python bench/warm_ranks.py --before /tmp/before          (4 steps, 1 round)
       .venv/bin/python bench/warm_ranks.py --before /tmp/before-local --layout local
Smoke: .venv/bin/python bench/warm_ranks.py --before /tmp/before --smoke  (not recorded)
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common import record

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "examples/configs/sft_tiny.yaml"
OVERRIDES = [
    "sft.val_at_start=false",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
]
BEFORE_NAME = "one launch per iteration"  # the --before row: code before warm rank groups
LAYOUTS = {  # the cluster of each layout
    "nodes": ["cluster.num_nodes=2", "cluster.gpus_per_node=1"],
    "local": ["cluster.num_nodes=1", "cluster.gpus_per_node=2"],
}


@contextmanager
def pool_of_two(repo: Path, pool: str, logs: Path, api_url: str) -> Iterator[None]:
    """Two stage workers of ``pool`` running ``repo``'s code, up before the block starts."""
    from prefect.client.orchestration import get_client

    from flows.placement import live_workers

    env = {**os.environ, "PREFECT_API_URL": api_url, "PYTHONDONTWRITEBYTECODE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "flows.stage_worker", "--pool", pool, "--name", f"{pool}-{i}"],
            cwd=repo,
            env=env,
            stdout=(logs / f"{pool}-{i}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    try:
        with get_client(sync_client=True) as client:
            while len(live_workers(client, pool)) < 2:
                time.sleep(0.5)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(60)


def measure(
    repo: Path, layout: str, steps: int, root: Path, logs: Path, api_url: str
) -> dict[str, float]:
    """One SFT run of ``repo``'s code on ``layout``'s ranks: its seconds per iteration and
    wall time."""
    from nemo_rl_core.storage.handles import RunRef, open_storage

    pool = f"bench-{uuid.uuid4().hex[:6]}"
    run_id = f"warm-{pool}"
    command = [
        sys.executable,
        "-m",
        "flows",
        "sft",
        "--config",
        CONFIG,
        "--run-id",
        run_id,
        "--storage-root",
        str(root),
        *OVERRIDES,
        *LAYOUTS[layout],
        f"sft.max_num_steps={steps}",
    ]
    placed = layout == "nodes"
    if placed:
        command.append(f"++cluster.placement.train={pool}")
    env = {**os.environ, "PREFECT_API_URL": api_url, "PYTHONDONTWRITEBYTECODE": "1"}
    with pool_of_two(repo, pool, logs, api_url) if placed else contextlib.nullcontext():
        started = time.perf_counter()
        with (logs / f"{run_id}.log").open("w") as log:
            subprocess.run(
                command, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, check=True
            )
        wall = time.perf_counter() - started
    storage = open_storage(RunRef(str(root), run_id))
    trains = [storage.read_manifest(i).stages["train"] for i in range(steps)]
    commits = [train.finished_at.timestamp() for train in trains]
    per_iteration = [b - a for a, b in zip(commits, commits[1:], strict=False)]
    return {
        "per_iteration": statistics.median(per_iteration),
        "train": statistics.median(train.metrics["seconds"] for train in trains[1:]),
        "wall": wall,
        "gaps": per_iteration,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code before")
    parser.add_argument(
        "--before-name",
        default=BEFORE_NAME,
        help="what the --before checkout's row is called (another warm checkout: its commit)",
    )
    parser.add_argument("--steps", type=int, default=None, help="default 4 (smoke 2)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="nodes")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    steps = args.steps or (2 if args.smoke else 4)
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    variants = {args.before_name: args.before.resolve(), "warm rank group": ROOT}
    results: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="warm-ranks-") as scratch:
        logs = Path(scratch) / "logs"
        logs.mkdir()
        with prefect_test_harness(server_startup_timeout=600):
            api_url = str(PREFECT_API_URL.value())
            for _ in range(args.rounds):
                for name, repo in variants.items():
                    got = measure(repo, args.layout, steps, Path(scratch) / "runs", logs, api_url)
                    print(f"{name}: {got}", flush=True)
                    results[name].append(got)
    lines = [f"{'variant':<26} {'s/iteration':>12} {'train s':>8} {'flow wall s':>12}  gaps (s)"]
    for name, runs in results.items():
        per = statistics.median(r["per_iteration"] for r in runs)
        train = statistics.median(r["train"] for r in runs)
        wall = statistics.median(r["wall"] for r in runs)
        gaps = " | ".join(" ".join(f"{g:.1f}" for g in r["gaps"]) for r in runs)
        lines.append(f"{name:<26} {per:>12.2f} {train:>8.2f} {wall:>12.1f}  {gaps}")
    table = "\n".join(lines)
    print(table)
    before = statistics.median(r["per_iteration"] for r in results[args.before_name])
    after = statistics.median(r["per_iteration"] for r in results["warm rank group"])
    where = {
        "nodes": "2 nodes x 1 rank (two stage workers, gloo on 127.0.0.1)",
        "local": "2 ranks of this machine launched by the flow (gloo)",
    }[args.layout]
    reading = (
        f"{steps} SFT steps of sft_tiny on {where}, {args.rounds} round(s): an iteration after the first takes "
        f"{before:.2f} s with {args.before_name}, {after:.2f} s with the warm rank group of "
        f"this checkout ({before / after:.1f}x)."
    )
    title = {"nodes": "two-node", "local": "one-machine two-rank"}[args.layout]
    record(f"Warm rank group: {title} SFT seconds per iteration", table, reading, args.smoke)


if __name__ == "__main__":
    main()
