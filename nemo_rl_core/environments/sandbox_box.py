"""One bubblewrap sandbox, started with a program of ours as its pid 1.

A box gets, from bubblewrap and the kernel: new user, pid, network, ipc, uts and cgroup
namespaces; no capabilities; no-new-privs; no further user namespaces; a new terminal
session; death with its parent; a read-only root holding only what the interpreter reads
(``sandbox_host``), its own ``/proc``, five devices (null, zero, full, random, urandom;
no terminal) and a private size-capped tmpfs, ``/box``, its only writable place; the
seccomp filter; a cgroup where the host delegates one (joined by pid 1 while bubblewrap
holds it, ``--block-fd``); and, when started as root, a host uid of its own from the pool
(``setpriv`` runs bubblewrap as it). Killing pid 1 kills every process of the box.

The program is ``BOOTSTRAP``, which loads our modules from the job's memfd (so no host
path needs to be readable by the box's uid) and calls the named one's ``main(job)``; the
name is also its last argument, so ``ps`` tells a sample's box from a judge's. The modules
travel compiled, by the box's own interpreter, once per process: compiling them in every
box cost it more than its interpreter's start.
"""

import contextlib
import functools
import json
import marshal
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from nemo_rl_core.environments.sandbox_cgroup import RunCgroup
from nemo_rl_core.environments.sandbox_host import DEVICES, Boundary, SandboxUnavailableError
from nemo_rl_core.environments.sandbox_uids import UidPool

BOX = "/box"
_INSIDE_UID = 1000
BOOTSTRAP = """
import marshal, sys
with open(int(sys.argv[1]), "rb") as job_file:
    job = marshal.load(job_file)
for name, code in job.pop("modules"):
    module = type(sys)("sandboxed." + name)
    module.__package__ = "sandboxed"
    sys.modules[module.__name__] = module
    exec(marshal.loads(code), module.__dict__)
sys.modules["sandboxed." + job.pop("main")].main(job)
"""
# The programs and what each loads, in order: standard library only, relative imports.
_HERE = Path(__file__).parent
PROGRAMS = {
    "code_harness": ("code_plain", "code_harness"),
    "code_judge": ("code_plain", "code_judge"),
}
_MODULES = ("code_plain", "code_harness", "code_judge")
_COMPILE = """
import marshal, sys
sources = marshal.load(sys.stdin.buffer)
compiled = {name: marshal.dumps(compile(source, name + ".py", "exec")) for name, source in sources.items()}
sys.stdout.buffer.write(marshal.dumps(compiled))
"""
_UIDS = UidPool()


@functools.cache
def compiled_modules(interpreter: str) -> dict[str, bytes]:
    """Our in-box modules as code objects marshalled by ``interpreter`` (whose bytecode may
    differ from this process's)."""
    sources = {name: (_HERE / f"{name}.py").read_text() for name in _MODULES}
    run = subprocess.run(
        [interpreter, "-I", "-S", "-B", "-c", _COMPILE],
        input=marshal.dumps(sources),
        capture_output=True,
        check=True,
    )
    return marshal.loads(run.stdout)


def memfd(name: str, data: bytes = b"") -> int:
    """An anonymous file holding ``data``, read from the start."""
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def readable(fd: int, timeout_s: float | None) -> bool:
    """Whether ``fd`` becomes readable within ``timeout_s`` (poll: fds past 1024 work too)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000))))


class Box:
    """A running sandbox: ``pid`` is its pid 1 on the host, ``monitor`` turns readable at its end.

    ``close`` kills what is left, removes its cgroup and gives its uid back.
    """

    def __init__(
        self,
        boundary: Boundary,
        program: str,
        job: dict,
        *,
        memory_bytes: int,
        max_pids: int,
        box_mb: int,
        stdio: tuple[int, int, int],
        pass_fds: tuple[int, ...] = (),
        start_timeout_s: float = 10.0,
    ) -> None:
        self._init: int | None = None
        with contextlib.ExitStack() as stack:  # undone at once if the box does not start
            uid = _UIDS.take() if boundary.setpriv else None
            cgroup = None
            if boundary.cgroups is not None:
                cgroup = RunCgroup(boundary.cgroups, memory_bytes, max_pids)
            stack.callback(_release, uid, cgroup)
            code = compiled_modules(boundary.interpreter)
            modules = [(name, code[name]) for name in PROGRAMS[program]]
            job_fd = memfd("job", marshal.dumps({**job, "modules": modules, "main": program}))
            seccomp = memfd("seccomp", boundary.seccomp_filter)
            status_read, status = os.pipe()  # bubblewrap reports its child's pid here
            block, unblock = os.pipe()  # and waits on this before it runs the program
            stack.callback(os.close, status_read)
            stack.callback(os.close, unblock)
            try:
                command = _bwrap_command(
                    boundary, program, box_mb, job_fd, seccomp, status, block, uid
                )
                self._process = subprocess.Popen(
                    command,
                    stdin=stdio[0],
                    stdout=stdio[1],
                    stderr=stdio[2],
                    pass_fds=(job_fd, seccomp, status, block, *pass_fds),
                    env={},
                    start_new_session=True,
                )
            finally:
                for fd in (job_fd, seccomp, status, block):  # bubblewrap holds the only copies
                    os.close(fd)
            self.monitor = os.pidfd_open(self._process.pid)
            stack.callback(os.close, self.monitor)
            stack.callback(self.kill)
            deadline = time.monotonic() + start_timeout_s
            self.pid, self._init = _namespace_init(status_read, deadline, stdio[2])
            if cgroup is not None:
                cgroup.add(self.pid)  # before it runs: all it starts is born inside
            os.write(unblock, b"x")
            self._stack = stack.pop_all()

    def ended(self) -> bool:
        return readable(self.monitor, 0)

    def wait(self, timeout_s: float) -> bool:
        """Whether the box ends by itself within ``timeout_s``."""
        return readable(self.monitor, timeout_s)

    def kill(self) -> None:
        """SIGKILL the namespace's pid 1, which takes every process of the box with it."""
        if self._init is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._init, signal.SIGKILL)
            os.close(self._init)
            self._init = None
        if not readable(self.monitor, 5):  # Popen.wait(timeout) would poll in sleeps
            self._process.kill()  # --die-with-parent takes the namespace down with bubblewrap
        self._process.wait()

    def close(self) -> None:
        self._stack.close()


def _release(uid: int | None, cgroup: RunCgroup | None) -> None:
    """Remove the box's cgroup (killing what is left in it), then give its uid back."""
    emptied = False
    try:
        if cgroup is not None:
            cgroup.remove()
            emptied = True
    finally:
        if uid is not None:
            _UIDS.give(uid, emptied=emptied)


def _bwrap_command(
    boundary: Boundary,
    program: str,
    box_mb: int,
    job: int,
    seccomp: int,
    status: int,
    block: int,
    uid: int | None,
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
        "--ro-bind", boundary.root, "/",
    ]  # fmt: skip
    for path in boundary.binds:
        command += ["--ro-bind", path, path]
    command += ["--proc", "/proc"]
    for device in DEVICES:
        command += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
    command += [
        "--perms", "0700", "--size", str(box_mb << 20), "--tmpfs", BOX, "--chdir", BOX,
        "--setenv", "HOME", BOX, "--setenv", "TMPDIR", BOX, "--setenv", "LANG", "C.UTF-8",
        "--seccomp", str(seccomp), "--json-status-fd", str(status), "--block-fd", str(block),
        "--", boundary.interpreter, "-I", "-S", "-B", "-c", BOOTSTRAP, str(job), program,
    ]  # fmt: skip
    return command


def _namespace_init(status_read: int, deadline: float, stderr: int) -> tuple[int, int]:
    """The host pid of the box's pid 1 and a pidfd to kill it by, from bubblewrap's status.

    Bubblewrap reports the pid, then blocks until unblocked, so the pid is still ours here.
    """
    data = b""
    while b"\n" not in data:
        chunk = (
            os.read(status_read, 4096)
            if readable(status_read, deadline - time.monotonic())
            else None
        )
        if not chunk:
            detail = os.pread(stderr, 2000, 0).decode(errors="replace").strip()
            why = "in time" if chunk is None else ""
            raise SandboxUnavailableError(f"bubblewrap did not start the sandbox {why}: {detail!r}")
        data += chunk
    pid = json.loads(data.split(b"\n", 1)[0])["child-pid"]
    try:
        return pid, os.pidfd_open(pid)
    except ProcessLookupError:
        raise SandboxUnavailableError("bubblewrap's sandbox died before it ran") from None
