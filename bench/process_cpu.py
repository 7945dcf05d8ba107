"""CPU seconds used by groups of processes over time, sampled in a thread, so that a
benchmark can say how much CPU each side spent between two moments it only learns later
(the commits of a flow run's stages, read back from its manifests).

A group is a root process and everything it started (looked up again every
``REFRESH_S``: the reward workers of a flow run, the connections PostgreSQL forks). A
process that exits keeps the CPU it had at the last sample, so a group's total never goes
down.

The sampler is the benchmark's apparatus, not what it measures: reading every member's
``/proc`` entry 20 times a second costs ~4% of a core. It runs on the cores it is given
(``CpuClock(cores=...)``: the servers' cores, where the process measured is pinned to
others) and its own CPU is left out of the group of the process it runs in.
"""

import bisect
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil

SAMPLE_S = 0.05
REFRESH_S = 1.0


class ProcessGroup:
    """A root process (found by ``find_root`` when first asked: it may start later) and
    its descendants; ``cpu_seconds`` is their user + system CPU so far."""

    def __init__(self, find_root: Callable[[], int | None], holds_sampler: bool = False) -> None:
        self.find_root = find_root
        self.holds_sampler = holds_sampler  # the sampler thread's CPU is counted out
        self._members: list[psutil.Process] = []
        self._last: dict[tuple[int, float], float] = {}
        self._refreshed = -REFRESH_S

    def cpu_seconds(self, now: float) -> float:
        if now - self._refreshed >= REFRESH_S:
            self._refresh()
            self._refreshed = now
        for process in self._members:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                self._last[(process.pid, process.create_time())] = times.user + times.system
        return sum(self._last.values())

    def _refresh(self) -> None:
        pid = self.find_root()
        if pid is None:
            self._members = []
            return
        try:
            root = psutil.Process(pid)
            self._members = [root, *root.children(recursive=True)]
        except psutil.Error:
            self._members = []


class CpuClock:
    """Samples each group's CPU seconds every ``SAMPLE_S`` in a daemon thread while it runs
    (``with clock.running():``); ``between(group, start, end)`` interpolates the samples at
    two ``time.time()`` moments. With ``cores`` the sampler thread runs on those only."""

    def __init__(self, groups: dict[str, ProcessGroup], cores: set[int] | None = None) -> None:
        self.groups = groups
        self.cores = cores
        self._times: list[float] = []
        self._cpu: dict[str, list[float]] = {name: [] for name in groups}
        self._stop = threading.Event()

    @contextmanager
    def running(self) -> Iterator["CpuClock"]:
        thread = threading.Thread(target=self._sample_until_stopped, name="cpu-clock", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    def _sample_until_stopped(self) -> None:
        if self.cores is not None:
            os.sched_setaffinity(0, self.cores)  # this thread only (Linux: a thread's own)
        while not self._stop.wait(SAMPLE_S):
            now = time.time()
            readings = {
                name: group.cpu_seconds(now) - (time.thread_time() if group.holds_sampler else 0)
                for name, group in self.groups.items()
            }
            self._times.append(now)
            for name, seconds in readings.items():
                self._cpu[name].append(seconds)

    def at(self, group: str, moment: float) -> float:
        """The group's CPU seconds at ``moment``, interpolated between the samples around
        it (nan before the first sample or after the last)."""
        times, cpu = self._times, self._cpu[group]
        i = bisect.bisect_left(times, moment)
        if i == 0 or i == len(times):
            return cpu[0] if times and moment == times[0] else float("nan")
        share = (moment - times[i - 1]) / (times[i] - times[i - 1])
        return cpu[i - 1] + share * (cpu[i] - cpu[i - 1])

    def between(self, group: str, start: float, end: float) -> float:
        return self.at(group, end) - self.at(group, start)


def this_process_tree() -> ProcessGroup:
    """This process and its children (reward workers, any engine process), without the
    sampler thread's own CPU."""
    return ProcessGroup(lambda: psutil.Process().pid, holds_sampler=True)


def pid_file_group(path: str) -> ProcessGroup:
    """The process whose pid is the first line of ``path`` (a service's pid file, a
    PostgreSQL ``postmaster.pid``) and its descendants; empty while the file is absent."""

    def root() -> int | None:
        try:
            with open(path) as file:
                return int(file.readline())
        except (OSError, ValueError):
            return None

    return ProcessGroup(root)
