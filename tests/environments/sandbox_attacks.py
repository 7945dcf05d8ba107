"""What the sandbox tests attack with: a way past the audit-hook filter, and canary checks.

``UNHOOKED`` defines ``spawn(code, setsid=False)`` inside a sample: it gets the built-in
``_posixsubprocess`` without an import event and starts a fresh interpreter, which has no
audit hook at all, so what that interpreter does meets only the real boundary. Tests that
use it also check that it ran, so a stronger filter shows up as a failing test.
"""

import os
import uuid
from pathlib import Path

UNHOOKED = """
import _imp, importlib.machinery, os, sys
_ps = _imp.create_builtin(importlib.machinery.ModuleSpec("_posixsubprocess", None))

def spawn(code, setsid=False):
    r, w = os.pipe()
    return _ps.fork_exec(
        [sys.executable, "-I", "-S", "-c", code], [os.fsencode(sys.executable)], True, (),
        None, None, -1, -1, -1, -1, -1, -1, r, w, True, setsid, -1, None, None, None, -1,
        None, False,
    )
"""


def token() -> str:
    """A unique canary string."""
    return f"canary-{uuid.uuid4().hex}"


def processes_with(text: str) -> list[int]:
    """Host pids whose command line contains ``text`` (processes a run left behind)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return pids


def reward_of(env, code: str, tests: list[dict]) -> tuple[float, str]:
    """The reward and its reason for one sample answering with ``code``."""
    result = env.step([answer(code)], [{"tests": tests}])
    return result.rewards.item(), result.metadata[0]["reward_reason"]


def answer(code: str) -> list[dict]:
    """A message log whose last turn answers with ``code`` in a fenced block."""
    return [
        {"role": "user", "content": "Write the program."},
        {"role": "assistant", "content": f"Here it is:\n```python\n{code}\n```\n"},
    ]
