"""Reward-side throughput: math checks per second by pool size, the cost of a checker
timeout (kill + respawn) next to normal checks, and code samples per second: a bare
interpreter per sample, one sandbox per test and one sandbox per sample (the environment),
side by side in one run.

Run: .venv/bin/python bench/environments.py   (--smoke: 8 samples, one repeat)
"""

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from nemo_rl_core.environments.code_assertions import compile_assert_test
from nemo_rl_core.environments.code_environment import CodeEnvironment
from nemo_rl_core.environments.code_sandbox import SandboxLimits, require_sandbox, run_sample
from nemo_rl_core.environments.math_environment import MathEnvironment
from nemo_rl_core.environments.sandbox_judge import JudgePool

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]

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


def _samples_per_second(
    run_sample_once: Callable[[], bool], pool: ThreadPoolExecutor, runs: int
) -> float:
    start = time.perf_counter()
    passed = list(pool.map(lambda _: run_sample_once(), range(runs)))
    elapsed = time.perf_counter() - start
    assert all(passed), "a benchmark sample failed"
    return runs / elapsed


def _env_rate(workers: int, runs: int) -> float:
    """Samples/s through ``CodeEnvironment.step``: 64 samples with 2 assert tests each."""
    env = CodeEnvironment({"num_workers": workers})
    logs = [[{"role": "assistant", "content": f"```python\n{ADD}```"}]] * runs
    metadata = [{"tests": [{"assert": test} for test in ADD_TESTS]}] * runs
    env.step(logs[:workers], metadata[:workers])  # the judges start here, once per worker
    start = time.perf_counter()
    result = env.step(logs, metadata)
    rate = runs / (time.perf_counter() - start)
    assert result.rewards.sum().item() == runs, "a benchmark sample failed"
    env.shutdown()
    return rate


def _code_samples(runs: int, repeats: int) -> None:
    """Samples/s of a solution with 2 assert tests: a bare interpreter per sample (no
    sandbox: the solution and its asserts in one ``-c``, with the sandbox's interpreter
    and flags, ``bare``, or with this venv's Python as a trainer would start it, ``venv``),
    one sandbox per test (each test a sample of its own) and one sandbox per sample, with
    1 and 2 workers.

    The paths alternate within each cell, ``repeats`` times, and each cell is the median:
    on a shared machine the load drifts between one path's turn and the other's.
    """
    boundary, limits = require_sandbox(), SandboxLimits()
    tests = [compile_assert_test(test) for test in ADD_TESTS]
    program = ADD + "\n".join(ADD_TESTS)
    judges = JudgePool(boundary, limits.memory_mb << 20, limits.output_bytes)

    def bare() -> bool:
        run = subprocess.run([boundary.interpreter, "-I", "-S", "-B", "-c", program])
        return run.returncode == 0

    def venv() -> bool:
        return subprocess.run([sys.executable, "-c", program]).returncode == 0

    def per_test() -> bool:
        return all(run_sample(ADD, [], [t], limits, judges).verdicts[0][0] for t in tests)

    def per_sample() -> bool:
        return all(ok for ok, _ in run_sample(ADD, [], tests, limits, judges).verdicts)

    paths = {"bare": bare, "venv": venv, "per-test": per_test, "per-sample": per_sample}
    print(f"code samples/s ({runs} samples x {len(tests)} assert tests, median of {repeats}):")
    print("  workers " + " ".join(f"{name:>10s}" for name in paths) + "  per-sample/bare")
    for workers in (1, 2):
        # the judges start outside the timing, in the threads that keep them
        with ThreadPoolExecutor(workers) as pool:
            _samples_per_second(per_sample, pool, 2 * workers)
            rates: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(repeats):
                for name, path in paths.items():
                    rates[name].append(_samples_per_second(path, pool, runs))
        medians = {name: statistics.median(values) for name, values in rates.items()}
        cells = " ".join(f"{medians[name]:10.1f}" for name in paths)
        print(f"  {workers:7d} {cells}  {medians['per-sample'] / medians['bare']:15.2f}")
    judges.close()
    print(f"through CodeEnvironment.step, 2 workers: {_env_rate(2, runs):.1f} samples/s")
    print(f"sandbox boundary: {boundary.describe()}")


def main() -> None:
    smoke = "--smoke" in sys.argv[1:]
    runs = 8 if smoke else 64
    math1, startup1 = _math_rate(1)
    math2, startup2 = _math_rate(2)
    print(f"math checks/s: 1 worker {math1:.1f}, 2 workers {math2:.1f}, ratio {math2 / math1:.2f}")
    print(f"math pool start-up: 1 worker {startup1:.1f} s, 2 workers {startup2:.1f} s")
    print(f"16 checks incl. one hanging sample (1 s limit, 2 workers): {_timeout_cost():.2f} s")
    _code_samples(runs, 1 if smoke else 3)
    print(f"cpu: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
