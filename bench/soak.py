"""Soak: N iterations of the tiny GRPO config on the real local stack (PostgreSQL, Prefect
server, process worker, moto S3), while seeded random SIGKILLs every few minutes take out
the flow-run process (the worker's child, with its reward workers) or the worker with it;
after each kill the same run_id is started again through the deployment until it
completes. Reports iterations completed, restarts, wall time, and whether the final weights
equal an undisturbed run's bit for bit: that reference runs the same config in a local
process on file:// storage, so it also shows that stack and local runs are bit-identical.

    nice -n 10 .venv/bin/python bench/soak.py --iterations 100      # about an hour here
    .venv/bin/python bench/soak.py --smoke                          # 1 iteration, 1 kill

Not a performance figure: it runs beside other work, and its result goes into the
reliability section of bench/RESULTS.md by hand.
"""

import argparse
import datetime as dt
import io
import json
import random
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "infra"))
from local_stack import LocalStack, attach_stack, kill_tree, running_stack  # noqa: E402

# The reliability suite's config: HF generation, two prompts of two samples.
CONFIG = "examples/configs/grpo_math_tiny_fast.yaml"
LEASE_TTL_S = 10  # a killed run's lease blocks the next one this long at most
MAX_UNPLANNED_FAILURES = 3


@dataclass
class Kill:
    at_s: float  # since the soak started
    target: str  # "flow-run" or "worker"
    flow_run_state: str  # what Prefect recorded for the killed flow run
    last_logged: str  # the newest stage log line of the killed flow run


@dataclass
class SoakResult:
    run_id: str
    iterations: int
    iterations_completed: int = 0
    flow_runs: int = 0
    kills: list[Kill] = field(default_factory=list)
    unplanned_failures: list[str] = field(default_factory=list)
    soak_wall_s: float = 0.0
    reference_wall_s: float = 0.0  # its start to its last commit
    weights_bit_equal: bool = False
    tensors_compared: int = 0


def start_reference(
    stack: LocalStack, root: Path, run_id: str, iterations: int
) -> subprocess.Popen:
    """The undisturbed run: the same config, in a local process, on file:// storage."""
    command = [sys.executable, "-m", "flows.grpo", "--config", CONFIG, "--run-id", run_id]
    command += ["--storage-root", str(root), f"grpo.max_num_steps={iterations}"]
    log = (root.parent / "reference.log").open("w")
    env = {**stack.env, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)


def last_stage_line(stack: LocalStack, flow_run_id: str) -> str:
    lines = [m for m in stack.flow_run_logs(flow_run_id) if " stage " in m]
    return lines[-1] if lines else "(no stage started)"


def kill_now(stack: LocalStack, rng: random.Random, worker_share: float, pids: list[int]) -> str:
    """SIGKILL the flow run's process ``pids`` or, with probability ``worker_share``, the
    worker and everything it started."""
    if rng.random() < worker_share:
        kill_tree(stack.worker_pid())
        stack.restart_worker()
        return "worker"
    for pid in pids:
        kill_tree(pid)
    return "flow-run"


def manual_deployment(stack: LocalStack) -> str:
    """The id of ``grpo/manual``, deployed from prefect.yaml unless the stack has it."""
    try:
        return stack.api("GET", "/deployments/name/grpo/manual")["id"]
    except urllib.error.HTTPError:
        return stack.deploy_all()["grpo/manual"]


def wait_for_lease_to_lapse(stack: LocalStack, run_id: str) -> None:
    """Until a dead run's lease is gone or expired, so the next run can take it over: none
    at all if it died before taking one, else at most ``LEASE_TTL_S``. A lease still renewed
    after twice that (a process of the run survived) is left to the next run, which says
    who holds it."""
    from nemo_rl_core.storage.lease import read_lease
    from nemo_rl_core.storage.run_storage import RunStorage

    storage = RunStorage(f"s3://{stack.bucket}", run_id, storage_options=stack.storage_options)
    deadline = time.monotonic() + 2 * LEASE_TTL_S
    while (lease := read_lease(storage)) is not None and lease["expires_at"] > time.time():
        if time.monotonic() > deadline:
            return
        time.sleep(0.5)


def drive_until_done(stack: LocalStack, args: argparse.Namespace, result: SoakResult) -> None:
    """Start the deployment for the run until a flow run completes, killing at random."""
    rng = random.Random(args.seed)
    deployment = manual_deployment(stack)
    parameters = {
        "run_id": result.run_id,
        "config_path": CONFIG,
        "overrides": [f"grpo.max_num_steps={args.iterations}"],
    }
    # PYTHONPATH: flow runs import this checkout's code, also from a `git worktree`.
    env = {"NEMO_RL_CORE_LEASE_TTL_S": str(LEASE_TTL_S), "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    while True:
        flow_run_id = stack.start_flow_run(deployment, parameters, env)
        result.flow_runs += 1
        kill_at = None  # the kill clock starts when the flow run's process does
        while True:
            if time.monotonic() - started > args.timeout_s:
                raise TimeoutError(f"soak not done after {args.timeout_s:.0f} s: {result}")
            flow_run = stack.api("GET", f"/flow_runs/{flow_run_id}")
            if flow_run["state_type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
                break
            pids = stack.flow_run_pids(flow_run_id) if len(result.kills) < args.max_kills else []
            if kill_at is None and pids:
                kill_at = time.monotonic() + rng.uniform(*args.kill_every_s)
            if kill_at and pids and time.monotonic() >= kill_at:
                last = last_stage_line(stack, flow_run_id)
                target = kill_now(stack, rng, args.worker_share, pids)
                state = "RUNNING (its worker is gone)"
                if target == "flow-run":
                    state = stack.wait_for_flow_run(flow_run_id, timeout=120)["state_type"]
                at = time.monotonic() - started
                result.kills.append(Kill(at, target, state, last))
                print(f"+{at:.0f} s: killed {target} ({state}); last: {last}", flush=True)
                wait_for_lease_to_lapse(stack, result.run_id)
                flow_run = None
                break
            time.sleep(0.25 if kill_at else 1.0)
        if flow_run is None:
            continue
        if flow_run["state_type"] == "COMPLETED":
            break
        message = f"{flow_run['state_type']}: {flow_run['state']['message']}"
        result.unplanned_failures.append(message)
        print(f"flow run {flow_run_id} {message}", flush=True)
        if len(result.unplanned_failures) > MAX_UNPLANNED_FAILURES:
            raise RuntimeError(f"soak gave up after {result.unplanned_failures}")
        wait_for_lease_to_lapse(stack, result.run_id)
    result.soak_wall_s = time.monotonic() - started


def compare_weights(stack: LocalStack, reference_root: Path, result: SoakResult) -> None:
    """The soak's newest committed checkpoint against the reference's, tensor by tensor."""
    import s3fs
    from safetensors.torch import load, load_file

    fs = s3fs.S3FileSystem(**stack.storage_options)
    checkpoints = f"{stack.bucket}/runs/{result.run_id}/checkpoints"
    committed = [p for p in fs.ls(checkpoints) if fs.exists(f"{p}/COMMITTED")]
    newest = max(committed)
    result.iterations_completed = int(newest.rsplit("_", 1)[-1])
    soaked = load(fs.cat_file(f"{newest}/model.safetensors"))
    reference_file = reference_root / "runs" / result.run_id / "checkpoints" / Path(newest).name
    reference = load_file(reference_file / "model.safetensors")
    result.tensors_compared = len(reference)
    result.weights_bit_equal = soaked.keys() == reference.keys() and all(
        soaked[name].equal(reference[name]) for name in reference
    )


def finished_at(root: Path, result: SoakResult) -> dt.datetime:
    """When a run's last stage committed (the manifest says; the process may end later)."""
    from nemo_rl_core.storage.run_storage import RunStorage

    manifest = RunStorage(str(root), result.run_id).read_manifest(result.iterations - 1)
    return manifest.stages["checkpoint"].finished_at


def soak(stack: LocalStack, args: argparse.Namespace, workdir: Path) -> SoakResult:
    result = SoakResult(run_id=f"soak-{secrets.token_hex(3)}", iterations=args.iterations)
    reference_root = workdir / "reference"
    reference_started = dt.datetime.now(dt.UTC)
    reference = start_reference(stack, reference_root, result.run_id, args.iterations)
    try:
        drive_until_done(stack, args, result)
        if reference.wait(timeout=600 + args.iterations * 120) != 0:
            raise RuntimeError(f"the reference run failed; see {workdir / 'reference.log'}")
        result.reference_wall_s = (
            finished_at(reference_root, result) - reference_started
        ).total_seconds()
    finally:
        if reference.poll() is None:
            kill_tree(reference.pid)
    compare_weights(stack, reference_root, result)
    return result


def report(result: SoakResult) -> str:
    out = io.StringIO()
    kinds = [kill.target for kill in result.kills]
    print(
        f"iterations completed {result.iterations_completed} of {result.iterations}; "
        f"restarts {len(result.kills)} (flow-run process {kinds.count('flow-run')}, "
        f"worker {kinds.count('worker')}); flow runs {result.flow_runs}; "
        f"unplanned failures {len(result.unplanned_failures)}",
        file=out,
    )
    print(
        f"wall: soak {result.soak_wall_s:.0f} s, undisturbed reference "
        f"{result.reference_wall_s:.0f} s (side by side)",
        file=out,
    )
    verdict = "bit-equal" if result.weights_bit_equal else "DIFFERENT"
    print(
        f"final weights vs undisturbed reference: {verdict} ({result.tensors_compared} tensors)",
        file=out,
    )
    print(json.dumps(asdict(result)), file=out)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kill-every-s",
        type=float,
        nargs=2,
        default=(120.0, 300.0),
        metavar=("MIN", "MAX"),
        help="seconds from a flow run's process start to its kill, uniform in [MIN, MAX]",
    )
    parser.add_argument("--worker-share", type=float, default=0.25, help="kills of the worker")
    parser.add_argument("--max-kills", type=int, default=1000)
    parser.add_argument("--timeout-s", type=float, default=4 * 3600)
    parser.add_argument(
        "--stack-state-dir", type=Path, help="use this running stack instead of starting one"
    )
    parser.add_argument("--smoke", action="store_true", help="1 iteration, one kill, ~3 min")
    args = parser.parse_args()
    if args.smoke:
        # One kill of the flow-run process: the worker of a shared test stack stays up.
        # A second after its process starts: still importing, on a fast machine too (one
        # tiny iteration can end a few seconds after the flow run is RUNNING).
        args.iterations, args.kill_every_s, args.max_kills = 1, (1.0, 1.0), 1
        args.worker_share, args.timeout_s = 0.0, 900
    with tempfile.TemporaryDirectory(prefix="soak-") as workdir:
        if args.stack_state_dir:
            result = soak(attach_stack(args.stack_state_dir), args, Path(workdir))
        else:
            with running_stack() as stack:
                result = soak(stack, args, Path(workdir))
    print(report(result), end="")
    if args.smoke:
        print("smoke run: not recorded in bench/RESULTS.md")
    return 0 if result.weights_bit_equal and result.iterations_completed == args.iterations else 1


if __name__ == "__main__":
    sys.exit(main())
