"""``bench/process_cpu.py``: the CPU seconds a group spent between two moments, read from
its samples afterwards, agree with what the process itself counted."""

import math
import os
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from process_cpu import (  # noqa: E402
    SAMPLE_S,
    CpuClock,
    ProcessGroup,
    pid_file_group,
    this_process_tree,
)


def spin(seconds: float) -> None:
    """Busy for ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class CostlyTree(ProcessGroup):
    """This process's tree, read at a cost: each sample busies the sampler for 15 ms."""

    def cpu_seconds(self, now: float) -> float:
        end = time.thread_time() + 0.015
        while time.thread_time() < end:
            pass
        return super().cpu_seconds(now)


def test_cpu_between_two_moments_is_what_the_process_spent_without_the_sampler() -> None:
    """The sampler's own CPU (here 15 ms a sample, ~0.1 s over the window) is not counted."""
    tree = this_process_tree()
    clock = CpuClock({"me": CostlyTree(tree.find_root, holds_sampler=tree.holds_sampler)})
    with clock.running():
        time.sleep(3 * SAMPLE_S)
        start, cpu_start = time.time(), time.thread_time()
        spin(0.4)
        end, cpu_end = time.time(), time.thread_time()
        sampler = next(t for t in threading.enumerate() if t.name == "cpu-clock")
        sampler_cpu = time.clock_gettime(time.pthread_getcpuclockid(sampler.ident))
        time.sleep(3 * SAMPLE_S)
    assert sampler_cpu > 0.05  # most of it inside the window
    # At each edge the CPU curve bends (idle to busy, busy to idle) between two samples, and
    # the straight line between them misses at most a quarter of that interval's CPU.
    kinks = sum(sample_interval_around(clock, moment) / 4 for moment in (start, end))
    measured = clock.between("me", start, end)
    assert measured == pytest.approx(cpu_end - cpu_start, abs=kinks + 0.005)


def sample_interval_around(clock: CpuClock, moment: float) -> float:
    """The seconds between the two samples ``moment`` falls between."""
    later = next(i for i, t in enumerate(clock._times) if t >= moment)
    return clock._times[later] - clock._times[later - 1]


def test_the_sampler_runs_on_the_cores_it_is_given_and_this_process_stays_put() -> None:
    everywhere = os.sched_getaffinity(0)
    last = {max(everywhere)}
    clock = CpuClock({"me": this_process_tree()}, cores=last)
    with clock.running():
        sampler = next(t for t in threading.enumerate() if t.name == "cpu-clock")
        assert sampler.native_id is not None
        deadline = time.monotonic() + 5  # the thread moves itself as it starts
        while os.sched_getaffinity(sampler.native_id) != last:
            assert time.monotonic() < deadline, os.sched_getaffinity(sampler.native_id)
            time.sleep(0.01)
    assert os.sched_getaffinity(0) == everywhere


def test_a_group_without_its_process_spends_nothing_and_unsampled_moments_are_unknown(
    tmp_path: Path,
) -> None:
    clock = CpuClock({"absent": pid_file_group(str(tmp_path / "server.pid"))})
    with clock.running():
        time.sleep(2 * SAMPLE_S)
        start = time.time()
        time.sleep(3 * SAMPLE_S)
        end = time.time()
        time.sleep(2 * SAMPLE_S)
    assert clock.between("absent", start, end) == 0.0
    assert math.isnan(clock.between("absent", start - 60, end))  # before the first sample
