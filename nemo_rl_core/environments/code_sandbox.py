"""Run untrusted, model-written Python so that an escape attempt fails the program, not the host.

Layers, each enough on its own for the attempts it names, together defence in depth:

- a fresh process group in its own network namespace (no interfaces: sockets cannot
  reach anything) when the host allows ``unshare``;
- an unprivileged user id of its own (when started as root), so RLIMIT_NPROC applies
  and a fork bomb runs out of processes, and root-only files stay closed;
- rlimits: CPU seconds, address space (memory), file size (caps stdout/stderr, which go to
  files, and anything written), open files, processes, no core dumps;
- an audit hook installed before the program runs (``python -I -S``): opening, listing or
  changing paths outside the sandbox directory (the standard library stays readable),
  sockets, fork/exec/subprocess/kill, ctypes and frame/GC introspection raise
  ``PermissionError``;
- a wall-clock limit after which the whole process group is killed, and a temporary
  directory (the program's cwd) removed afterwards.
"""

import contextlib
import ctypes
import functools
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

_CLONE_NEWNET = 0x40000000
# Unprivileged ids for sandboxes, one per concurrent run; processes sharing a host take
# different 256-id blocks (by pid) so their runs rarely share a uid's process count.
_UID_FIRST, _UID_BLOCKS, _UID_BLOCK = 61000, 16, 256

_GUARD = r"""
import os, sys, sysconfig

def _install(root, read_roots):
    # Closure state only: the program cannot reach this function to rewrite it.
    blocked = ("socket.", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
               "os.system", "subprocess.", "os.kill", "os.setuid", "os.setsid", "ctypes.",
               "gc.get_", "sys._current_frames", "resource.setrlimit", "pty.", "sys.setprofile",
               "sys.settrace", "os.chroot")
    blocked_imports = ("ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "gc")
    path_events = {"os.listdir", "os.scandir", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
                   "os.chmod", "os.chown", "os.link", "os.symlink", "os.truncate", "os.utime",
                   "os.chdir", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def inside(path, roots):
        if isinstance(path, int):
            return True
        real = realpath(fsdecode(path) if isinstance(path, bytes) else str(path))
        return any(real == r or real.startswith(r + sep) for r in roots)

    def guard(event, args):
        if event.startswith(blocked):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in blocked_imports:
            raise PermissionError(f"sandbox: import of {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = (mode and any(c in mode for c in "wax+")) or (flags or 0) & write_flags
            if path is not None and not inside(path, (root,) if writes else (root,) + read_roots):
                raise PermissionError(f"sandbox: open of {path!r} outside the sandbox is refused")
        elif event in path_events:
            listing = event in ("os.listdir", "os.scandir")
            roots = (root,) + read_roots if listing else (root,)
            for path in args:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path, roots):
                    raise PermissionError(f"sandbox: {event} on {path!r} outside the sandbox is refused")
        elif event == "object.__setattr__" and type(args[0]).__name__ in ("function", "code"):
            raise PermissionError("sandbox: rewriting functions is not allowed")

    sys.addaudithook(guard)

_paths = sysconfig.get_paths()
_install(os.path.realpath(sys.argv[1]),
         tuple({os.path.realpath(_paths[k]) for k in ("stdlib", "platstdlib")}))
del _install, _paths
with open("solution.py") as _file:
    _source = _file.read()
exec(compile(_source, "solution.py", "exec"), {"__name__": "__main__"})
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run."""

    wall_time_s: float = 10.0
    cpu_time_s: int = 5
    memory_mb: int = 512
    output_bytes: int = 1 << 20
    max_processes: int = 16
    max_open_files: int = 64


@dataclass(frozen=True)
class SandboxResult:
    """What one run did; ``reason`` says why it failed ("" when it exited 0)."""

    exit_code: int | None
    stdout: str
    stderr: str
    reason: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.reason


class _UidPool:
    """Hands each concurrent run its own unprivileged uid (NPROC is counted per uid)."""

    def __init__(self) -> None:
        start = _UID_FIRST + (os.getpid() % _UID_BLOCKS) * _UID_BLOCK
        self._free = list(range(start, start + _UID_BLOCK))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError("more concurrent sandboxes than sandbox uids")
            return self._free.pop()

    def give(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid)


_UIDS = _UidPool()


@functools.cache
def network_namespace_available() -> bool:
    """Whether this host lets a child enter an empty network namespace (probed once)."""
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(
        [sys.executable, "-I", "-S", "-c", "pass"],
        preexec_fn=_enter_network_namespace,  # noqa: PLW1509
        capture_output=True,
    )
    return probe.returncode == 0


def _enter_network_namespace() -> None:
    if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET) != 0:
        os._exit(125)  # never run the program with the network it was meant to lack


@functools.cache
def sandbox_interpreter() -> tuple[str, bool]:
    """(python executable, drop to an unprivileged uid) for sandboxed programs.

    As root the program runs under a uid of its own, which needs an interpreter that
    uid can reach: this one if its whole path is world-executable, else the system's.
    """
    if os.geteuid() != 0:
        return sys.executable, False
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and _world_reachable(os.path.realpath(candidate)):
            return candidate, True
    return sys.executable, False


def _world_reachable(path: str) -> bool:
    parts = path.split(os.sep)
    dirs = [os.sep.join(parts[:i]) or os.sep for i in range(1, len(parts))]
    if not all(os.stat(d).st_mode & stat.S_IXOTH for d in dirs):
        return False
    return bool(os.stat(path).st_mode & stat.S_IXOTH)


def _limit_child(limits: SandboxLimits, uid: int | None, isolate_network: bool) -> None:
    """Runs in the child between fork and exec: namespace, rlimits, then drop privileges."""
    if isolate_network:
        _enter_network_namespace()
    cap = limits.output_bytes
    memory = limits.memory_mb * 1024 * 1024
    for limit, value in (
        (resource.RLIMIT_CPU, (limits.cpu_time_s, limits.cpu_time_s + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_FSIZE, (cap, cap)),
        (resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files)),
        (resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes)),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(limit, value)
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def run_sandboxed(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` as a Python program fed ``stdin``; never raises for what the program does."""
    limits = limits or SandboxLimits()
    interpreter, drop_uid = sandbox_interpreter()
    uid = _UIDS.take() if drop_uid else None
    workdir = tempfile.mkdtemp(prefix="nemo_rl_sandbox_")
    os.chmod(workdir, 0o711)  # the sandbox uid may pass through to its own directory
    outdir = tempfile.mkdtemp(prefix="nemo_rl_sandbox_out_")  # outside the program's reach
    try:
        sandbox = os.path.join(workdir, "box")
        os.mkdir(sandbox)
        with open(os.path.join(sandbox, "solution.py"), "w") as handle:
            handle.write(code)
        if uid is not None:
            os.chown(sandbox, uid, uid)
            os.chown(os.path.join(sandbox, "solution.py"), uid, uid)
        return _run(interpreter, sandbox, outdir, stdin, limits, uid)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(outdir, ignore_errors=True)
        if uid is not None:
            _UIDS.give(uid)


def _run(
    interpreter: str,
    sandbox: str,
    outdir: str,
    stdin: str,
    limits: SandboxLimits,
    uid: int | None,
) -> SandboxResult:
    out_path, err_path = os.path.join(outdir, "stdout"), os.path.join(outdir, "stderr")
    command = [interpreter, "-I", "-S", "-B", "-c", _GUARD, sandbox]
    isolate = network_namespace_available()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            cwd=sandbox,
            env={"PATH": "/usr/bin:/bin", "HOME": sandbox, "TMPDIR": sandbox, "LANG": "C.UTF-8"},
            start_new_session=True,
            preexec_fn=lambda: _limit_child(limits, uid, isolate),  # noqa: PLW1509
        )
        reason = ""
        try:
            process.communicate(stdin.encode(), timeout=limits.wall_time_s)
        except subprocess.TimeoutExpired:
            reason = f"wall time limit of {limits.wall_time_s:g}s exceeded"
        except (BrokenPipeError, OSError):
            pass  # the program exited without reading its input
        finally:
            _kill_group(process)
    code = process.returncode
    # Python ignores SIGXFSZ, so a capped write shows up as a full file and an OSError.
    capped = max(os.path.getsize(out_path), os.path.getsize(err_path)) >= limits.output_bytes
    if not reason and capped:
        reason = f"output limit of {limits.output_bytes} bytes exceeded"
    elif not reason and code is not None and code < 0:
        reason = _signal_reason(-code, limits)
    elif not reason and code == 125 and isolate:
        reason = "could not enter an isolated network namespace"
    elif not reason and code != 0:
        reason = f"exited with code {code}"
    return SandboxResult(
        code, _read_capped(out_path, limits), _read_capped(err_path, limits), reason
    )


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _signal_reason(signum: int, limits: SandboxLimits) -> str:
    if signum == signal.SIGXFSZ:
        return f"output limit of {limits.output_bytes} bytes exceeded"
    if signum in (signal.SIGXCPU, signal.SIGKILL):
        return f"killed by {signal.Signals(signum).name} (CPU limit {limits.cpu_time_s}s or memory)"
    return f"killed by {signal.Signals(signum).name}"


def _read_capped(path: str, limits: SandboxLimits) -> str:
    with open(path, "rb") as handle:
        return handle.read(limits.output_bytes).decode("utf-8", errors="replace")
