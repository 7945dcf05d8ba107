"""A cgroup per sandboxed run where the host delegates one: memory, process and CPU limits
for all of the run's processes together (rlimits bound each process alone, so six children
could otherwise hold six times the memory limit).

Supported: cgroup v2 where this process's cgroup already enables the memory, pids and cpu
controllers for its children, and cgroup v1 with writable memory, pids and cpu hierarchies.
Elsewhere ``delegated_cgroups`` is None and the sandbox relies on its rlimits alone.
"""

import contextlib
import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass

_MOUNT = "/sys/fs/cgroup"
_V1_CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000
_names = itertools.count()


@dataclass(frozen=True)
class CgroupParents:
    """Where run cgroups are made: one directory (v2) or one per controller (v1)."""

    version: int
    parents: tuple[str, ...]


@functools.cache
def delegated_cgroups() -> CgroupParents | None:
    """The cgroup directories this process may create run cgroups in, or None (probed once)."""
    own = _own_cgroups()
    if os.path.exists(os.path.join(_MOUNT, "cgroup.controllers")):
        parent = os.path.join(_MOUNT, own.get("", "/").lstrip("/"))
        try:
            with open(os.path.join(parent, "cgroup.subtree_control")) as handle:
                enabled = set(handle.read().split())
        except OSError:
            return None
        if {"memory", "pids", "cpu"} <= enabled and os.access(parent, os.W_OK):
            return CgroupParents(2, (parent,))
        return None
    parents = tuple(
        os.path.join(_MOUNT, name, own.get(name, "/").lstrip("/")) for name in _V1_CONTROLLERS
    )
    if all(os.access(parent, os.W_OK) for parent in parents):
        return CgroupParents(1, parents)
    return None


def _own_cgroups() -> dict[str, str]:
    """Controller -> this process's cgroup path ("" is the v2 unified hierarchy)."""
    paths = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


class RunCgroup:
    """One run's cgroup: made with its limits, given the run's pid 1, removed whole."""

    def __init__(self, where: CgroupParents, memory_bytes: int, max_pids: int) -> None:
        name = f"nemo_rl_sandbox_{os.getpid()}_{next(_names)}"
        self.dirs = tuple(os.path.join(parent, name) for parent in where.parents)
        if where.version == 2:
            settings = {
                "memory.max": memory_bytes,
                "memory.swap.max": 0,
                "pids.max": max_pids,
                "cpu.max": f"{_CPU_PERIOD_US} {_CPU_PERIOD_US}",
            }
        else:
            settings = {
                "memory.limit_in_bytes": memory_bytes,
                "memory.memsw.limit_in_bytes": memory_bytes,
                "pids.max": max_pids,
                "cpu.cfs_period_us": _CPU_PERIOD_US,
                "cpu.cfs_quota_us": _CPU_PERIOD_US,
            }
        for directory in self.dirs:
            os.mkdir(directory, 0o700)
        try:
            for key, value in settings.items():
                self._write(key, str(value))
        except BaseException:
            self.remove()
            raise

    def _write(self, key: str, value: str) -> None:
        written = False
        for directory in self.dirs:
            path = os.path.join(directory, key)
            if os.path.exists(path):
                with open(path, "w") as handle:
                    handle.write(value)
                written = True
        # memsw and swap files exist only where swap accounting is on; the rest must.
        if not written and "swap" not in key and "memsw" not in key:
            raise OSError(f"cgroup control file {key} is missing under {self.dirs}")

    def add(self, pid: int) -> None:
        """Move ``pid`` in; the processes it starts from then on are born inside."""
        for directory in self.dirs:
            with open(os.path.join(directory, "cgroup.procs"), "w") as handle:
                handle.write(str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for directory in self.dirs:
            with (
                contextlib.suppress(FileNotFoundError),
                open(os.path.join(directory, "cgroup.procs")) as handle,
            ):
                found.update(int(line) for line in handle if line.strip())
        return found

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill whatever is left in it, then remove it; OSError if it will not empty."""
        deadline = time.monotonic() + timeout_s
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise OSError(f"cgroup {self.dirs[0]} still holds processes {sorted(pids)}")
            time.sleep(0.01)
        for directory in self.dirs:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(directory)
