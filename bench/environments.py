"""Reward-side throughput: math checks per second by pool size, sandbox runs per second,
the cost of a checker timeout (kill + respawn) next to normal checks, and code samples per
second through the old sandbox (audit hook, network namespace, uid; loaded from git at
``LEGACY_COMMIT``) and through the bubblewrap sandbox, side by side in one run.

Run: .venv/bin/python bench/environments.py   (--smoke: 8 samples, one repeat)
"""

import os
import platform
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nemo_rl_core.environments.code_environment import CodeEnvironment
from nemo_rl_core.environments.code_sandbox import require_sandbox, run_sandboxed
from nemo_rl_core.environments.math_environment import MathEnvironment

REPO = Path(__file__).resolve().parents[1]
# The last commit whose code sandbox was the audit hook (issue 22 replaced it).
LEGACY_COMMIT = "d246369"
ADD = "def add(a, b):\n    return a + b\n"

RESPONSES = [f"We get \\boxed{{\\frac{{{i}}}{{{i + 1}}}}}" for i in range(1, 65)]
TRUTHS = [f"{i / (i + 1):.12f}" if i % 2 else f"\\frac{{{i}}}{{{i + 1}}}" for i in range(1, 65)]


def _math_rate(num_workers: int) -> tuple[float, float]:
    start = time.perf_counter()
    env = MathEnvironment({"num_workers": num_workers, "timeout_seconds": 10})
    startup = time.perf_counter() - start
    logs = [[{"role": "assistant", "content": r}] for r in RESPONSES]
    metadata = [{"ground_truth": t} for t in TRUTHS]
    env.step(logs[:4], metadata[:4])  # warm
    start = time.perf_counter()
    env.step(logs, metadata)
    rate = len(logs) / (time.perf_counter() - start)
    env.shutdown()
    return rate, startup


def _timeout_cost() -> float:
    env = MathEnvironment({"num_workers": 2, "timeout_seconds": 1.0})
    logs = [[{"role": "assistant", "content": "\\boxed{9^{9^{9}}}"}]] + [
        [{"role": "assistant", "content": r}] for r in RESPONSES[:15]
    ]
    metadata = [{"ground_truth": "1"}] + [{"ground_truth": t} for t in TRUTHS[:15]]
    start = time.perf_counter()
    env.step(logs, metadata)
    elapsed = time.perf_counter() - start
    env.shutdown()
    return elapsed


def _sandbox_rate(num_workers: int, runs: int) -> float:
    env = CodeEnvironment({"num_workers": num_workers})
    logs = [[{"role": "assistant", "content": "```python\nprint(input()[::-1])\n```"}]] * runs
    metadata = [{"tests": [{"input": "abc\n", "output": "cba"}]}] * runs
    start = time.perf_counter()
    env.step(logs, metadata)
    rate = runs / (time.perf_counter() - start)
    env.shutdown()
    return rate


def _legacy_run_sandboxed() -> Callable | str:
    """The old ``run_sandboxed`` from git, or why it cannot be loaded (e.g. a shallow clone)."""
    source = subprocess.run(
        ["git", "show", f"{LEGACY_COMMIT}:nemo_rl_core/environments/code_sandbox.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if source.returncode != 0:
        return source.stderr.strip() or "git show failed"
    module = types.ModuleType("legacy_code_sandbox")
    exec(compile(source.stdout, "legacy_code_sandbox.py", "exec"), module.__dict__)
    return module.run_sandboxed


def _samples_per_second(run_sample: Callable[[], bool], num_workers: int, runs: int) -> float:
    with ThreadPoolExecutor(num_workers) as pool:
        start = time.perf_counter()
        passed = list(pool.map(lambda _: run_sample(), range(runs)))
        elapsed = time.perf_counter() - start
    assert all(passed), "a benchmark sample failed"
    return runs / elapsed


def _old_vs_bwrap(runs: int, repeats: int) -> None:
    """Samples/s of a stdout test and an assert test through each sandbox, 1 and 2 workers.

    The paths alternate within each cell, ``repeats`` times, and each cell is the median:
    on a shared machine the load drifts between one path's turn and the other's.
    """
    legacy = _legacy_run_sandboxed()
    paths: dict[str, dict[str, Callable[[], bool]]] = {
        "bwrap": {
            "stdout": lambda: run_sandboxed("print(input()[::-1])", "abc\n").stdout == "cba\n",
            "assert": lambda: run_sandboxed(ADD, probes=["add(2, 3)"]).probes[0].value == 5,
        }
    }
    if isinstance(legacy, str):
        print(f"old sandbox: not measured ({legacy})")
    else:
        paths["old"] = {
            "stdout": lambda: legacy("print(input()[::-1])", "abc\n").stdout == "cba\n",
            "assert": lambda: legacy(ADD + "assert add(2, 3) == 5\n").ok,
        }
    names = [name for name in ("old", "bwrap") if name in paths]
    print(f"code samples/s ({runs} samples, one test each, median of {repeats}):")
    print("  test   workers " + " ".join(f"{name:>6s}" for name in names) + "  bwrap/old")
    for test in ("stdout", "assert"):
        for workers in (1, 2):
            rates: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(repeats):
                for name in names:
                    rates[name].append(_samples_per_second(paths[name][test], workers, runs))
            medians = {name: statistics.median(values) for name, values in rates.items()}
            ratio = f"{medians['bwrap'] / medians['old']:9.2f}" if "old" in medians else ""
            cells = " ".join(f"{medians[name]:6.1f}" for name in names)
            print(f"  {test:6s} {workers:7d} {cells}  {ratio}")
    boundary = require_sandbox()
    starts = {
        "bare interpreter": lambda: subprocess.run(
            [boundary.interpreter, "-I", "-S", "-c", "pass"]
        ),
        "bwrap": lambda: run_sandboxed("pass"),
    }
    if "old" in paths:
        starts["old"] = lambda: legacy("pass")
    cells = []
    for name, start_one in starts.items():
        times = []
        for _ in range(repeats * 7):
            start = time.perf_counter()
            start_one()
            times.append(time.perf_counter() - start)
        cells.append(f"{name} {statistics.median(times) * 1000:.0f} ms")
    print(f"one run of `pass` (median of {repeats * 7}): " + ", ".join(cells))
    print(f"bwrap boundary: {boundary.describe()}")


def main() -> None:
    smoke = "--smoke" in sys.argv[1:]
    runs = 8 if smoke else 64
    math1, startup1 = _math_rate(1)
    math2, startup2 = _math_rate(2)
    print(f"math checks/s: 1 worker {math1:.1f}, 2 workers {math2:.1f}, ratio {math2 / math1:.2f}")
    print(f"math pool start-up: 1 worker {startup1:.1f} s, 2 workers {startup2:.1f} s")
    print(f"16 checks incl. one hanging sample (1 s limit, 2 workers): {_timeout_cost():.2f} s")
    code1, code2 = _sandbox_rate(1, runs), _sandbox_rate(2, runs)
    print(f"sandbox runs/s: 1 worker {code1:.1f}, 2 workers {code2:.1f}, ratio {code2 / code1:.2f}")
    _old_vs_bwrap(runs, 1 if smoke else 3)
    print(f"cpu: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
