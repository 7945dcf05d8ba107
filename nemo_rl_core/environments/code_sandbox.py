"""Run untrusted, model-written Python behind a real boundary: bubblewrap, one sandbox per run.

Each run gets, from bubblewrap (``bwrap``, a Debian package) and the kernel:

- new user, pid, network, ipc, uts and cgroup namespaces; no capabilities; no-new-privs; no
  further user namespaces; a new terminal session; killed with its parent;
- a mount namespace holding only the interpreter, its standard library and the system
  libraries (read-only), a minimal ``/proc`` of its own processes and ``/dev`` (read-only),
  and a private size-capped tmpfs, ``/box``, the only writable place (mode 0700, seen by
  no other run); nothing of the host's ``/tmp``, ``/dev/shm``, ``/var/tmp`` or sockets;
- a seccomp filter (built with libseccomp through ctypes: its Python binding is not in the
  venv, and Debian's python3-seccomp serves only the system Python) that denies the
  syscalls a Python program never needs and kernel exploits love (ptrace, mount, keyctl,
  bpf, io_uring, ...);
- rlimits, set by the harness before the sample runs, on CPU seconds, address space, file
  size (stdin, stdout and stderr are memfds; output is capped), open files, core dumps and
  processes (counted per user namespace, so per run); and a cgroup per run where the host
  delegates one (``sandbox_cgroup``), joined by the run's pid 1 while bubblewrap holds it
  (``--block-fd``), for the memory, process and CPU use of all its processes together;
- when started as root, an unprivileged host uid of its own from a pool (``setpriv`` runs
  bubblewrap as it); a uid goes back to the pool only once no process runs under it.

The run is the harness (``code_harness``) as the namespace's pid 1, so killing it kills
every process of the run, setsid daemons included; the sample's code, job and report pass
through memfds, never through a host directory. If bubblewrap cannot build this here,
``require_sandbox`` raises ``SandboxUnavailableError``: there is no weaker fallback.
"""

import contextlib
import functools
import json
import marshal
import os
import secrets
import select
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nemo_rl_core.environments import code_harness
from nemo_rl_core.environments.code_harness import decode_plain
from nemo_rl_core.environments.sandbox_cgroup import RunCgroup
from nemo_rl_core.environments.sandbox_host import Boundary, SandboxUnavailableError, host_boundary
from nemo_rl_core.environments.sandbox_uids import UidPool

BOX = "/box"
_INSIDE_UID = 1000
_HARNESS = Path(code_harness.__file__).read_text()


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run."""

    wall_time_s: float = 10.0
    cpu_time_s: int = 5
    memory_mb: int = 512
    output_bytes: int = 1 << 20
    max_processes: int = 16
    max_open_files: int = 64
    box_mb: int = 16


@dataclass(frozen=True)
class ProbeOutcome:
    """One probe's plain value, or ``error`` saying why it has none."""

    value: object = None
    error: str = ""


@dataclass(frozen=True)
class SandboxResult:
    """What one run did; ``reason`` says why it failed ("" when it exited 0 and reported).

    ``probes`` holds one outcome per probe in probe mode, in order, and is empty otherwise.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    reason: str
    probes: tuple[ProbeOutcome, ...] = ()

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.reason


_UIDS = UidPool()


@functools.cache
def require_sandbox() -> Boundary:
    """The sandbox this host can build, checked by one real run; SandboxUnavailableError if none."""
    return probe_boundary("bwrap")


def probe_boundary(bwrap: str) -> Boundary:
    """Build the boundary with the ``bwrap`` executable given and prove it runs a program."""
    boundary = host_boundary(bwrap)
    limits = SandboxLimits()
    try:
        result = _run(boundary, _job("print('sandbox ok')", None, limits, True), "", limits)
    except (SandboxUnavailableError, OSError) as error:
        result = SandboxResult(None, "", str(error), "it did not start")
    if result.stdout.strip() != "sandbox ok":
        raise SandboxUnavailableError(
            f"bubblewrap ({boundary.bwrap}) could not start a sandbox here ({result.reason}): "
            f"{result.stderr.strip()[-500:]!r}. It needs unprivileged user namespaces "
            "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone = 1, and "
            "no AppArmor/SELinux rule against them; in a container: a seccomp profile that "
            "allows unshare/clone of namespaces). The code environment does not fall back."
        )
    return boundary


def _job(
    code: str, probes: Sequence[str] | None, limits: SandboxLimits, first_filter: bool
) -> dict:
    return {
        "nonce": secrets.token_hex(16),
        "source": code,
        "probes": None if probes is None else list(probes),
        "rlimits": {
            "RLIMIT_CPU": [limits.cpu_time_s] * 2,
            "RLIMIT_AS": [limits.memory_mb << 20] * 2,
            "RLIMIT_FSIZE": [limits.output_bytes] * 2,
            "RLIMIT_NOFILE": [limits.max_open_files] * 2,
            "RLIMIT_NPROC": [limits.max_processes] * 2,
            "RLIMIT_CORE": [0, 0],
        },
        "first_filter": first_filter,
    }


def run_sandboxed(
    code: str,
    stdin: str = "",
    limits: SandboxLimits | None = None,
    probes: Sequence[str] | None = None,
    first_filter: bool = True,
) -> SandboxResult:
    """Run ``code`` in a fresh sandbox; never raises for what the program does.

    Without ``probes`` the code runs as a program fed ``stdin``. With ``probes`` it runs as
    a module and each probe expression is evaluated after it; their plain values come back
    in ``SandboxResult.probes``. ``first_filter=False`` leaves out the audit-hook filter,
    so tests can show that the boundary holds on its own.
    """
    limits = limits or SandboxLimits()
    return _run(require_sandbox(), _job(code, probes, limits, first_filter), stdin, limits)


def _run(boundary: Boundary, job: dict, stdin: str, limits: SandboxLimits) -> SandboxResult:
    uid = _UIDS.take() if boundary.setpriv else None
    cgroup = None
    try:
        if boundary.cgroups is not None:
            cgroup = RunCgroup(boundary.cgroups, limits.memory_mb << 20, limits.max_processes)
        return _spawn(boundary, job, stdin, limits, uid, cgroup)
    finally:
        if cgroup is not None:
            cgroup.remove()
        if uid is not None:
            _UIDS.give(uid)


def _memfd(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _bwrap_command(
    boundary: Boundary, limits: SandboxLimits, fds: dict[str, int], uid: int | None
) -> list[str]:
    # setpriv instead of Popen(user=...): that would fork this (often large) process
    # rather than vfork it, ~10 ms per run with torch loaded
    command = [] if uid is None or boundary.setpriv is None else [
        boundary.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
    ]  # fmt: skip
    command += [
        boundary.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
        "--new-session", "--as-pid-1", "--cap-drop", "ALL", "--clearenv",
        "--uid", str(_INSIDE_UID), "--gid", str(_INSIDE_UID),
    ]  # fmt: skip
    for path in boundary.binds:
        command += ["--ro-bind", path, path]
    for link, target in boundary.links:
        command += ["--symlink", target, link]
    command += [
        "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
        "--perms", "0700", "--size", str(limits.box_mb << 20), "--tmpfs", BOX,
        "--remount-ro", "/", "--chdir", BOX,
        "--setenv", "HOME", BOX, "--setenv", "TMPDIR", BOX, "--setenv", "LANG", "C.UTF-8",
        "--seccomp", str(fds["seccomp"]), "--json-status-fd", str(fds["status"]),
        "--block-fd", str(fds["block"]),
        "--", boundary.interpreter, "-I", "-S", "-B", "-c", _HARNESS, str(fds["job"]), str(fds["result"]),
    ]  # fmt: skip
    return command


def _spawn(
    boundary: Boundary,
    job: dict,
    stdin: str,
    limits: SandboxLimits,
    uid: int | None,
    cgroup: RunCgroup | None,
) -> SandboxResult:
    with contextlib.ExitStack() as stack:
        fds = {
            "job": _memfd("job", marshal.dumps(job)),
            "result": _memfd("result"),
            "stdin": _memfd("stdin", stdin.encode()),
            "stdout": _memfd("stdout"),
            "stderr": _memfd("stderr"),
            "seccomp": _memfd("seccomp", boundary.seccomp_filter),
        }
        for fd in fds.values():
            stack.callback(os.close, fd)
        status_read, status = os.pipe()  # bubblewrap reports its child's pid here
        block, unblock = os.pipe()  # and waits on this before it runs the harness
        stack.callback(os.close, status_read)
        stack.callback(os.close, unblock)
        start = time.monotonic()
        try:
            process = subprocess.Popen(
                _bwrap_command(boundary, limits, {**fds, "status": status, "block": block}, uid),
                stdin=fds["stdin"],
                stdout=fds["stdout"],
                stderr=fds["stderr"],
                pass_fds=(fds["job"], fds["result"], fds["seccomp"], status, block),
                env={},
                start_new_session=True,
            )
        finally:
            os.close(status)  # bubblewrap holds the only copies of these two now
            os.close(block)
        monitor = os.pidfd_open(process.pid)
        stack.callback(os.close, monitor)
        init = None
        try:
            pid, init = _namespace_init(status_read, start + limits.wall_time_s)
            if cgroup is not None:
                cgroup.add(pid)  # before it runs: all it starts is born inside
            os.write(unblock, b"x")
            remaining = start + limits.wall_time_s - time.monotonic()
            exited = _readable(monitor, remaining)
        except SandboxUnavailableError as error:
            _kill_namespace(process, init)
            stderr = _read(fds["stderr"], 2000).strip()
            raise SandboxUnavailableError(
                f"{error} (exit code {process.returncode}): {stderr!r}"
            ) from None
        _kill_namespace(process, init)
        reason = "" if exited else f"wall time limit of {limits.wall_time_s:g}s exceeded"
        return _result(process.returncode, reason, job, fds, limits)


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether ``fd`` becomes readable within ``timeout_s`` (poll: fds past 1024 work too)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


def _namespace_init(status_read: int, deadline: float) -> tuple[int, int]:
    """The host pid of the run's pid 1 and a pidfd to kill it by, from bubblewrap's status.

    Bubblewrap reports the pid, then blocks until unblocked, so the pid is still ours here.
    """
    data = b""
    while b"\n" not in data:
        if not _readable(status_read, deadline - time.monotonic()):
            raise SandboxUnavailableError("bubblewrap did not start the sandbox in time")
        chunk = os.read(status_read, 4096)
        if not chunk:
            raise SandboxUnavailableError("bubblewrap did not start the sandbox")
        data += chunk
    pid = json.loads(data.split(b"\n", 1)[0])["child-pid"]
    try:
        return pid, os.pidfd_open(pid)
    except ProcessLookupError:
        raise SandboxUnavailableError("bubblewrap's sandbox died before it ran") from None


def _kill_namespace(process: subprocess.Popen, init: int | None) -> None:
    """SIGKILL the namespace's pid 1, which takes every process of the run with it."""
    if init is not None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(init, signal.SIGKILL)
        os.close(init)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()  # --die-with-parent takes the namespace down with bubblewrap
        process.wait()


def _result(
    code: int | None, reason: str, job: dict, fds: dict[str, int], limits: SandboxLimits
) -> SandboxResult:
    stdout, stderr = (_read(fds[name], limits.output_bytes) for name in ("stdout", "stderr"))
    capped = (
        max(os.fstat(fds["stdout"]).st_size, os.fstat(fds["stderr"]).st_size) >= limits.output_bytes
    )
    probes: tuple[ProbeOutcome, ...] = ()
    if not reason and capped:
        reason = f"output limit of {limits.output_bytes} bytes exceeded"
    elif not reason and code is not None and code > 128 and code - 128 in signal.valid_signals():
        reason = _signal_reason(code - 128, limits)
    elif not reason and code != 0:
        reason = f"exited with code {code}"
    elif not reason and job["probes"] is not None:
        try:
            probes = _read_report(fds["result"], job, limits)
        except ValueError as error:
            reason = str(error)
    return SandboxResult(code, stdout, stderr, reason, probes)


def _read_report(fd: int, job: dict, limits: SandboxLimits) -> tuple[ProbeOutcome, ...]:
    """The harness's report, checked: this run's nonce, one plain outcome per probe."""
    data = os.pread(fd, limits.output_bytes, 0)
    nonce, _, body = data.partition(b"\n")
    if not data:
        raise ValueError("the program ended before the harness reported (an early exit?)")
    if nonce != job["nonce"].encode():
        raise ValueError("the harness's report does not carry this run's nonce")
    try:
        results = json.loads(body)["results"]
        if type(results) is not list or len(results) != len(job["probes"]):
            raise ValueError("wrong number of results")
        outcomes = []
        for entry in results:
            if type(entry) is dict and set(entry) == {"error"} and type(entry["error"]) is str:
                outcomes.append(ProbeOutcome(error=entry["error"]))
            elif type(entry) is dict and set(entry) == {"value"}:
                outcomes.append(ProbeOutcome(value=decode_plain(entry["value"])))
            else:
                raise ValueError(f"malformed result {str(entry)[:100]}")
        return tuple(outcomes)
    except (ValueError, TypeError, KeyError, RecursionError) as error:  # a forged report
        raise ValueError(f"the harness's report is not plain JSON: {error}") from None


def _read(fd: int, limit: int) -> str:
    return os.pread(fd, limit, 0).decode("utf-8", errors="replace")


def _signal_reason(signum: int, limits: SandboxLimits) -> str:
    name = signal.Signals(signum).name
    if signum == signal.SIGXFSZ:
        return f"output limit of {limits.output_bytes} bytes exceeded"
    if signum in (signal.SIGXCPU, signal.SIGKILL):
        return f"killed by {name} (CPU limit {limits.cpu_time_s}s or memory)"
    return f"killed by {name}"
