"""TimedProcessPool's workers never outlive the process that owns the pool."""

import os
import signal
import subprocess
import sys
import time

import psutil

OWNER = """
import sys, time
from nemo_rl_core.environments.worker_pool import TimedProcessPool
pools = [TimedProcessPool(abs, num_workers=2) for _ in range(2)]
print(" ".join(str(pid) for pool in pools for pid in pool.pids), flush=True)
time.sleep(600)
"""


def test_workers_exit_when_their_owner_is_killed() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in owner.stdout.readline().split()]
    assert len(workers) == 4 and all(psutil.pid_exists(pid) for pid in workers)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 30
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [
            pid
            for pid in alive
            if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        ]
    assert not alive, f"pool workers outlived their killed owner: {alive}"
