"""``bench/process_cpu.py``: the CPU seconds a group spent between two moments, read from
its samples afterwards, agree with what the process itself counted."""

import math
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from process_cpu import SAMPLE_S, CpuClock, pid_file_group, this_process_tree  # noqa: E402


def spin(seconds: float) -> None:
    """Busy for ``seconds`` of this process's CPU time."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_between_two_moments_is_what_the_process_spent() -> None:
    clock = CpuClock({"me": this_process_tree()})
    with clock.running():
        time.sleep(3 * SAMPLE_S)
        start, cpu_start = time.time(), time.process_time()
        spin(0.4)
        end, cpu_end = time.time(), time.process_time()
        time.sleep(3 * SAMPLE_S)
    # the sampler thread's own CPU counts too: a little more, never less
    assert clock.between("me", start, end) == pytest.approx(cpu_end - cpu_start, abs=0.1)


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
