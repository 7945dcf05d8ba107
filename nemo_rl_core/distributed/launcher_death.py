"""A node's torchrun must end when the worker that launched it dies.

``launch_node`` starts torchrun's agent in a session of its own (so that a stage timeout can
stop the agent and its ranks together), which also means nothing stops them when the
launching worker is killed outright (SIGKILL, the OOM killer): the ranks would go on
training for an attempt whose stage run has already failed and will be run again. Linux's
parent-death signal closes that gap: the agent asks the kernel for SIGTERM when its
launcher dies, and torch's agent answers SIGTERM by stopping its ranks.
"""

import ctypes
import os
import signal
import sys

LAUNCHER_PID_ENV = "NEMO_RL_CORE_LAUNCHER_PID"
"""Set by the launcher to its own pid: the process whose death should end this one."""

_PR_SET_PDEATHSIG = 1


def end_with_launcher() -> None:
    """Have this process get SIGTERM when its launcher (``LAUNCHER_PID_ENV``) dies; if the
    launcher died already, end now. Does nothing off Linux or without a launcher pid."""
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if launcher is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(launcher):  # the launcher died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)
