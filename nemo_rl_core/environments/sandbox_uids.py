"""Host uids for sandboxed runs started as root: one per concurrent run, exclusive across
processes, and back in the pool only once no process runs under it."""

import contextlib
import fcntl
import os
import signal
import threading
import time

# 16 blocks of 256 uids; a process starts from the block its pid picks, so processes on
# one host rarely contend for the same lock files.
_UID_FIRST, _UID_BLOCKS, _UID_BLOCK = 61000, 16, 256
_UID_LOCKS = "/run/nemo_rl_sandbox_uids"
SANDBOX_UIDS = range(_UID_FIRST, _UID_FIRST + _UID_BLOCKS * _UID_BLOCK)


class UidPool:
    """Hands each concurrent run its own host uid; takes it back only once nothing runs as it.

    A uid is held through an exclusive lock file in ``_UID_LOCKS`` (released by the kernel
    if this process dies), so processes whose blocks collide never share a uid either.
    """

    def __init__(self) -> None:
        start = _UID_FIRST + (os.getpid() % _UID_BLOCKS) * _UID_BLOCK
        self._free = list(range(start, start + _UID_BLOCK))
        self._held: dict[int, int] = {}
        self._lock = threading.Lock()

    def take(self) -> int:
        os.makedirs(_UID_LOCKS, mode=0o700, exist_ok=True)
        with self._lock:
            for uid in reversed(self._free):
                fd = os.open(os.path.join(_UID_LOCKS, str(uid)), os.O_CREAT | os.O_RDWR, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)  # another process holds it
                    continue
                if live_processes(uid):  # a survivor of some earlier owner
                    os.close(fd)
                    continue
                self._free.remove(uid)
                self._held[uid] = fd
                return uid
        raise RuntimeError("more concurrent sandboxes than free sandbox uids")

    def give(self, uid: int, timeout_s: float = 5.0, emptied: bool = False) -> None:
        """Return ``uid`` once no live process has it; kill stragglers, else keep it out.

        ``emptied``: the caller saw every process of the run leave its cgroup, which each
        was born in, so there is nothing to look for (a scan of /proc costs ~1 ms).
        """
        deadline = time.monotonic() + timeout_s
        while not emptied and (pids := live_processes(uid)):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return  # kept locked: no run anywhere may share a uid with a survivor
            time.sleep(0.01)
        with self._lock:
            os.close(self._held.pop(uid))
            self._free.append(uid)


def live_processes(uid: int) -> list[int]:
    """Host pids of processes (not zombies) owned by ``uid``."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids
