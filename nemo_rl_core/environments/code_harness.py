"""The first process of a sample's sandbox (its pid 1): runs the sample once per test kind.

Standard library only; the box loads it from source (``sandbox_box.BOOTSTRAP``). Its job
(the sample's source, the stdin of each stdout test, whether assert tests follow, the
rlimits) comes marshalled by the host.

- Each stdout test runs the sample as a program in a child of its own, fed the test's
  stdin, with the rlimits set and the audit-hook filter installed there; this process
  waits for it up to the wall time, then kills whatever the test left running.
- For assert tests one child runs the sample as a module and answers the judge's
  requests (``serve``): look up a name, read an attribute, call an object, each with
  plain values, answering with a plain value, a reference to an object that is not plain,
  or the error it raised. It never sees a test's source or an expected value.

Each child's outcome goes to the host as a record (a JSON header, then the raw output) on
the result descriptor. Nothing here is a boundary: the sample shares the box, may tamper
with these processes and forge their records or answers. The host trusts none of it;
the judge judges plain values only, and expected values never enter this box.
"""

import atexit
import builtins
import marshal
import os
import resource
import select
import sys

from .code_plain import decode_plain, dump_json, encode_plain, read_frame, write_frame

_SIGKILL = 9
_STDERR_TAIL = 2000


def main(job: dict) -> None:
    """Run the stdout tests, then serve the assert tests; one record per child."""
    if os.getpid() != 1:  # kill(-1) below is the box's own processes only as its pid 1
        raise SystemExit("code_harness runs only as the first process of a sandbox")
    result_fd = job["result_fd"]
    for stdin in job["stdins"]:
        _record(result_fd, _run_program(job, stdin))
    if job["serve"]:
        _record(result_fd, _run_server(job))
    os._exit(0)


def _record(fd: int, parts: tuple[dict, bytes, bytes]) -> None:
    header, stdout, stderr = parts
    header = {**header, "stdout": len(stdout), "stderr": len(stderr)}
    os.write(fd, dump_json(header).encode() + b"\n" + stdout + stderr)


def _memfd(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run_program(job: dict, stdin: str) -> tuple[dict, bytes, bytes]:
    """One stdout test: the sample as ``__main__`` in a child, within the wall time."""
    fds = (_memfd("stdin", stdin.encode()), _memfd("stdout"), _memfd("stderr"))
    pid = os.fork()
    if pid == 0:
        try:
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            _enter_limits(job, job["rlimits"], keep=())
            _run_as_main(job["source"])
        finally:
            os._exit(1)  # a child never returns into this loop
    status, timed_out = _wait(pid, job["wall_time_s"])
    _kill_the_rest()
    limit = job["output_bytes"]
    stdout_size, stderr_size = (os.fstat(fd).st_size for fd in fds[1:])
    stdout = os.pread(fds[1], limit, 0)
    stderr = os.pread(fds[2], _STDERR_TAIL, max(0, stderr_size - _STDERR_TAIL))
    for fd in fds:
        os.close(fd)
    header = {"status": status, "timed_out": timed_out, "capped": stdout_size >= limit}
    return header, stdout, stderr


def _run_server(job: dict) -> tuple[dict, bytes, bytes]:
    """The assert tests: a child serves the judge until the judge closes its end."""
    requests, replies = job["requests_fd"], job["replies_fd"]
    write_frame(replies, b'{"started":true}')  # the judge starts each test's clock from here
    pid = os.fork()
    if pid == 0:
        try:
            _enter_limits(job, job["server_rlimits"], keep=(requests, replies))
            serve(job["source"], requests, replies)
        finally:
            os._exit(1)  # a child never returns into this loop
    os.close(requests)
    os.close(replies)
    status, _ = _wait(pid, None)
    _kill_the_rest()  # so the judge reads the end of its replies as soon as the server dies
    return {"status": status, "timed_out": False, "capped": False}, b"", b""


def _wait(pid: int, timeout_s: float | None) -> tuple[int, bool]:
    """The child's wait status, and whether it was killed at the wall time."""
    monitor = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(monitor, select.POLLIN)
    timed_out = not poller.poll(None if timeout_s is None else int(timeout_s * 1000))
    if timed_out:
        os.kill(pid, _SIGKILL)
    os.close(monitor)
    return os.waitpid(pid, 0)[1], timed_out


def _kill_the_rest() -> None:
    """As the namespace's pid 1, kill every other process of the box and reap them all."""
    if os.getpid() != 1:  # anywhere else, -1 would mean every process this user may signal
        raise SystemExit("code_harness kills processes only as a sandbox's first process")
    try:  # noqa: SIM105 -- contextlib would cost the box an import
        os.kill(-1, _SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _enter_limits(job: dict, rlimits: dict, keep: tuple[int, ...]) -> None:
    """In a child, before the sample runs: only stdio and ``keep`` open, rlimits, the filter.

    The rlimits are inherited by all the child starts and never raised again (no
    capabilities). CPU's soft and hard limits are equal, so the kernel kills at once.
    """
    last = 2
    for fd in [*sorted(keep), os.sysconf("SC_OPEN_MAX")]:  # descriptors are below the limit
        os.closerange(last + 1, fd)
        last = fd
    for name, (soft, hard) in rlimits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    sys.argv = ["solution.py"]
    if job["first_filter"]:
        _install_first_filter()


def _install_first_filter() -> None:
    """Refuse process creation, sockets, native code, signals, gc and tracing early.

    The sandbox contains all of these without it; the filter only fails such samples
    with a clear reason. Its lists are constants of the hook's own code, not names a
    sample could rebind, and the hook keeps its own references to what it calls. (Frames
    stay reachable: namedtuple and enum need sys._getframe, tracebacks need tb_frame.)
    """
    startswith, join = str.startswith, str.join

    def guard(event: str, args: tuple) -> None:
        blocked = (
            "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
            "subprocess.", "socket.", "ctypes.", "os.kill", "os.setsid", "pty.", "gc.get_",
            "sys._current_frames", "sys.setprofile", "sys.settrace", "resource.setrlimit",
        )  # fmt: skip
        if startswith(event, blocked):
            raise PermissionError(f"sandbox: {event} is not allowed")
        # join copies a str subclass's characters without calling its methods
        if event == "import" and join("", (args[0],)) in {
            "ctypes", "_ctypes", "gc", "_xxsubinterpreters",
        }:  # fmt: skip
            raise PermissionError(f"sandbox: import of {args[0]} is not allowed")

    sys.addaudithook(guard)


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 -- the sample's exception may raise from __str__
        text = ""
    return f"{type(error).__name__}: {text}"[:300]


def _run_as_main(source: str) -> None:
    """Run ``source`` as ``python solution.py`` would, then exit with its exit code."""
    module = type(sys)("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    code = 0
    try:
        exec(compile(source, "solution.py", "exec"), module.__dict__)
    except SystemExit as error:
        code = _exit_code(error)
    except BaseException:  # noqa: BLE001 -- printed as Python prints an uncaught error
        sys.excepthook(*sys.exc_info())
        code = 1
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()  # as Python waits for non-daemon threads at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 -- e.g. past the output limit: Python's exit code 120
            code = code or 120
    os._exit(code & 0xFF)


def _exit_code(error: SystemExit) -> int:
    if error.code is None:
        return 0
    if type(error.code) is int:
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def serve(source: str, requests: int, replies: int) -> None:
    """Run ``source`` as the module ``solution``, then answer the judge until it hangs up."""
    module = type(sys)("solution")
    namespace = module.__dict__
    namespace["__builtins__"] = builtins
    sys.modules["solution"] = module
    write, exit_now = write_frame, os._exit
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as error:  # noqa: BLE001 -- SystemExit too: an early exit fails
        write(replies, dump_json({"fatal": f"the solution raised {_describe(error)}"}).encode())
        exit_now(0)
    objects: list = []
    # the judge's requests carry a test's arguments: the box's memory limit bounds them
    while (request := read_frame(requests, 1 << 62)) is not None:
        write(replies, dump_json(_answer(marshal.loads(request), namespace, objects)).encode())
    exit_now(0)


def _answer(request: tuple, namespace: dict, objects: list) -> dict:
    """One request of the judge: ("name", name), ("attr", ref, name), ("call", ref, args, kwargs)."""

    def resolve(ref: object) -> object:
        if type(ref) is not int:
            raise ValueError(f"malformed reference {ref!r}")
        return objects[ref]

    try:
        if request[0] == "name":
            if request[1] not in namespace:
                return {"missing": request[1]}
            value = namespace[request[1]]
        elif request[0] == "attr":
            value = getattr(objects[request[1]], request[2])
        else:
            args = decode_plain(request[2], resolve=resolve)
            kwargs = decode_plain(request[3], resolve=resolve)
            if type(args) is not list or type(kwargs) is not dict:
                raise ValueError("malformed call")
            value = objects[request[1]](*args, **kwargs)
    except BaseException as error:  # noqa: BLE001 -- SystemExit too: the test fails with it
        return {"error": _describe(error)}
    try:
        return {"value": encode_plain(value)}
    except (TypeError, ValueError, RecursionError) as why:
        objects.append(value)
        return {"ref": len(objects) - 1, "why": _describe(why)}
