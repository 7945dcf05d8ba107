"""A worker killed outright takes its node's torchrun and ranks with it."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

LAUNCHER = textwrap.dedent(
    """
    import sys
    from nemo_rl_core.distributed.node_launch import Rendezvous, RendezvousNotes, launch_node
    from nemo_rl_core.storage.run_storage import RunStorage

    root, rank_script = sys.argv[1], sys.argv[2]
    notes = RendezvousNotes(RunStorage(root, "orphans"), 0, "train", "attempt-1")
    launch_node([rank_script], 0, Rendezvous("attempt-1", 1, 1), notes)
    """
)


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def test_killing_the_launcher_ends_the_agent_and_its_ranks(tmp_path: Path) -> None:
    marker = tmp_path / "rank-started"
    rank_script = tmp_path / "rank.py"
    rank_script.write_text(f"import time\nopen({str(marker)!r}, 'w').close()\ntime.sleep(600)\n")
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path / "store"), str(rank_script)],
        cwd=Path(__file__).resolve().parents[2],
    )
    left: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert launcher.poll() is None, "the launcher ended before its rank started"
            assert time.monotonic() < deadline, "the rank never started"
            time.sleep(0.2)
        left = _descendants(launcher.pid)
        assert len(left) >= 2  # torchrun's agent and the rank, each in its own session
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        _, alive = psutil.wait_procs(left, timeout=30)
        assert not alive, f"still running 30 s after their launcher was killed: {alive}"
    finally:
        if launcher.poll() is None:
            left = left or _descendants(launcher.pid)
            launcher.kill()
        for process in left:  # whatever outlived the check: never leave it running
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
