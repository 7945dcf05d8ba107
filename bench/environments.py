"""Reward-side throughput: math checks per second by pool size, sandbox runs per second,
and the cost of a checker timeout (kill + respawn) next to normal checks.

Run: .venv/bin/python bench/environments.py
"""

import os
import platform
import time

from nemo_rl_core.environments.code_environment import CodeEnvironment
from nemo_rl_core.environments.code_sandbox import run_sandboxed
from nemo_rl_core.environments.math_environment import MathEnvironment

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


def _sandbox_rate(num_workers: int, runs: int = 16) -> float:
    env = CodeEnvironment({"num_workers": num_workers})
    logs = [[{"role": "assistant", "content": "```python\nprint(input()[::-1])\n```"}]] * runs
    metadata = [{"tests": [{"input": "abc\n", "output": "cba"}]}] * runs
    start = time.perf_counter()
    env.step(logs, metadata)
    rate = runs / (time.perf_counter() - start)
    env.shutdown()
    return rate


def main() -> None:
    math1, startup1 = _math_rate(1)
    math2, startup2 = _math_rate(2)
    print(f"math checks/s: 1 worker {math1:.1f}, 2 workers {math2:.1f}, ratio {math2 / math1:.2f}")
    print(f"math pool start-up: 1 worker {startup1:.1f} s, 2 workers {startup2:.1f} s")
    print(f"16 checks incl. one hanging sample (1 s limit, 2 workers): {_timeout_cost():.2f} s")
    single = time.perf_counter()
    run_sandboxed("print(1)")
    single = time.perf_counter() - single
    code1, code2 = _sandbox_rate(1), _sandbox_rate(2)
    print(f"sandbox runs/s: 1 worker {code1:.1f}, 2 workers {code2:.1f}, ratio {code2 / code1:.2f}")
    print(f"one sandboxed run (spawn + guard + limits): {single * 1000:.0f} ms")
    print(f"cpu: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
