"""Seconds from the command to the refusal of each config mistake (issue 19, item 6), and of
one mistake in every flow (issue 32, item 3).

Each mistake runs ``python -m flows.grpo --config ...`` in a subprocess, from a temporary
working directory, with the run's storage and log folders pointed into a fresh temporary
folder; the table shows the median wall and CPU seconds (``wall/cpu``; CPU time shows the
work where a shared machine's load stretches the wall time), the exit code, how many lines the command
wrote to stderr, whether anything was written, and the last stderr line. With ``--before``
another checkout runs each mistake in turn with this one, so both see the same load.

    .venv/bin/python bench/fail_fast.py                  # this checkout
    .venv/bin/python bench/fail_fast.py --before OTHER   # and another checkout, in turn
    .venv/bin/python bench/fail_fast.py --in-repo        # from the checkout, not a temp folder
    .venv/bin/python bench/fail_fast.py --flows          # policy.bogus_key=1 in every flow
                                                         # (python -m flows.<x>, its example)
"""

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = "examples/configs/grpo_math_tiny.yaml"
# kind -> what the command line adds to the valid config (ABSENT: a path that does not exist)
ABSENT = "/nonexistent/nemo-rl-core"
MISTAKES: dict[str, list[str]] = {
    "unknown key": ["grpo.num_prompts_per_stepp=2"],
    "wrong type": ["policy.train_micro_batch_size=abc"],
    "missing config file": ["--config", f"{ABSENT}/grpo.yaml"],
    "missing data file": [
        "data.train.dataset_name=ResponseDataset",
        f"+data.train.data_path={ABSENT}/problems.jsonl",
    ],
    "unknown environment": ["data.default.env_name=maths"],
    "unknown model": ["policy.model_name=no-such-model"],
    "backend not on this machine": [
        "policy.generation.backend=vllm",
        "policy.generation.vllm_cfg.tensor_parallel_size=4",
    ],
    "logger package missing": ["logger.swanlab_enabled=true"],
}
# --flows: every declared algorithm's flow refuses this unknown key in its example config.
FLOW_MISTAKE = ["policy.bogus_key=1"]


@dataclass(frozen=True)
class Outcome:
    seconds: float
    cpu_seconds: float  # user + system time of the command and the processes it waited for
    returncode: int
    stderr_lines: int
    wrote: bool
    last_line: str


@dataclass(frozen=True)
class Flow:
    """A flow's command: ``python -m flows.<module> --config <repo>/<config>``."""

    module: str = "grpo"
    config: str = CONFIG


def command(repo: Path, mistake: list[str], out: Path, flow: Flow) -> list[str]:
    """The flow's command with one mistake; outputs go under ``out`` (absolute paths)."""
    config = [] if "--config" in mistake else ["--config", str(repo / flow.config)]
    outputs = [
        f"checkpointing.checkpoint_dir={out}/results",
        f"logger.log_dir={out}/logs",
    ]
    return [sys.executable, "-m", f"flows.{flow.module}", *config, *mistake, *outputs]


def run_mistake(
    repo: Path, mistake: list[str], timeout: float, in_repo: bool, flow: Flow
) -> Outcome:
    with tempfile.TemporaryDirectory() as temp, tempfile.TemporaryDirectory() as out:
        cwd = repo if in_repo else Path(temp)
        env = {**os.environ, "PYTHONPATH": str(repo)}
        started = time.perf_counter()
        cpu_before = _children_cpu()
        # A session of its own: a command that was not refused starts Prefect's server and
        # the engines, which a timeout must stop too.
        process = subprocess.Popen(
            command(repo, mistake, Path(out), flow),
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stderr = process.communicate(timeout=timeout)[1]
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stderr = process.communicate()[1] + "\n(timed out)"
        seconds = time.perf_counter() - started
        cpu_seconds = _children_cpu() - cpu_before
        code = process.returncode
        lines = [line for line in stderr.splitlines() if line.strip()]
        wrote = any(Path(temp).iterdir()) or any(Path(out).iterdir())
        return Outcome(seconds, cpu_seconds, code, len(lines), wrote, lines[-1] if lines else "")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(
    repo: Path, mistake: list[str], args: argparse.Namespace, flow: Flow = Flow()
) -> tuple[str, Outcome]:
    """``wall/cpu`` median seconds of ``args.runs`` runs (``*``: not refused as a config
    mistake, exit code other than 2) and the last run's outcome."""
    outcomes = [
        run_mistake(repo, mistake, args.timeout, args.in_repo, flow) for _ in range(args.runs)
    ]
    wall = statistics.median(o.seconds for o in outcomes)
    cpu = statistics.median(o.cpu_seconds for o in outcomes)
    refused = "" if outcomes[-1].returncode == 2 else "*"
    return f"{wall:.1f}/{cpu:.1f}{refused}", outcomes[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout to run (its flows)")
    parser.add_argument(
        "--before", type=Path, default=None, help="another checkout, timed in turn with --repo"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per mistake (median shown)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--only", nargs="*", default=None, help="mistake kinds to run")
    parser.add_argument(
        "--in-repo", action="store_true", help="run from the checkout (default: a temp folder)"
    )
    parser.add_argument(
        "--flows", action="store_true", help="policy.bogus_key=1 in every flow's example config"
    )
    args = parser.parse_args()
    rows = flow_rows() if args.flows else [(kind, Flow(), m) for kind, m in MISTAKES.items()]
    print(
        f"{'mistake':28} {'before s':>11} {'after s':>9} {'rc':>3} {'lines':>5} {'wrote':>5}  refusal"
    )
    for kind, flow, mistake in rows:
        if args.only and kind not in args.only:
            continue
        before = "-"
        if args.before is not None:  # in turn, so both see the same load
            before = timed(args.before.resolve(), mistake, args, flow)[0]
        after, last = timed(args.repo.resolve(), mistake, args, flow)
        wrote = "yes" if last.wrote else "no"
        print(
            f"{kind:28} {before:>11} {after:>9} {last.returncode:3d} {last.stderr_lines:5d} "
            f"{wrote:>5}  {last.last_line[:100]}",
            flush=True,
        )


def flow_rows() -> list[tuple[str, Flow, list[str]]]:
    """One row per declared algorithm: its flow, its declared example config, the mistake."""
    from nemo_rl_core.pipeline.registry import registered_pipelines

    return [
        (f"flows.{name}", Flow(name, pipeline.default_config), FLOW_MISTAKE)
        for name, pipeline in registered_pipelines().items()
    ]


if __name__ == "__main__":
    main()
