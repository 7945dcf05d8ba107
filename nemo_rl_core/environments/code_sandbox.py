"""Run untrusted, model-written Python behind a real boundary: one bubblewrap sandbox per sample.

``run_sample`` runs a sample against all its tests in one sandbox (``sandbox_box``: the
namespaces, mounts, seccomp filter, cgroup and uid it gets). Its first process
(``code_harness``) runs each stdout test as a program of its own, fed the test's stdin,
then serves its assert tests to a judge (``sandbox_judge``, ``code_judge``) in a sandbox
of its own, which evaluates each assert and asks the sample's sandbox only for what the
solution computes: expected values never enter the sample's sandbox. ``run_sandboxed``
runs one program.

Per test: the wall time (kept by the box's first process for a program, by the judge for
an assert test), rlimits on CPU seconds, address space, file size (stdout and stderr are
memfds; output is capped), open files, core dumps and processes (counted per user
namespace, so per sample), set in the process that runs the sample. Per sample: one wall
time per test and one to start, kept here, and the cgroup's memory, process and CPU
bounds. What a sandbox reports is read within size bounds and never trusted: stdout is
compared here as text, values are decoded and judged only in the judge, whose CPU is bounded.

If bubblewrap cannot build this here, ``require_sandbox`` raises
``SandboxUnavailableError``: there is no weaker fallback.
"""

import contextlib
import functools
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nemo_rl_core.environments.code_assertions import AssertTest
from nemo_rl_core.environments.code_plain import PROGRAM_ENDED
from nemo_rl_core.environments.sandbox_box import Box, memfd
from nemo_rl_core.environments.sandbox_host import Boundary, SandboxUnavailableError, host_boundary
from nemo_rl_core.environments.sandbox_judge import JudgePool

_STDERR_TAIL = 2000


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of each test of a sample."""

    wall_time_s: float = 10.0
    cpu_time_s: int = 5
    memory_mb: int = 512
    output_bytes: int = 1 << 20
    max_processes: int = 16
    max_open_files: int = 64
    box_mb: int = 16


@dataclass(frozen=True)
class SandboxResult:
    """What one program did; ``reason`` says why it failed ("" when it exited 0)."""

    exit_code: int | None
    stdout: str
    stderr: str
    reason: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.reason


@dataclass(frozen=True)
class SampleResult:
    """One sample's outcome: a program per stdout test, a (passed, why) per assert test."""

    programs: tuple[SandboxResult, ...]
    verdicts: tuple[tuple[bool, str], ...]


@functools.cache
def require_sandbox() -> Boundary:
    """The sandbox this host can build, checked by one real run; SandboxUnavailableError if none."""
    return probe_boundary("bwrap")


def probe_boundary(bwrap: str) -> Boundary:
    """Build the boundary with the ``bwrap`` executable given and prove it runs a program."""
    boundary = host_boundary(bwrap)
    try:
        result = _run(boundary, "print('sandbox ok')", [""], (), SandboxLimits(), None, True)
        program = result.programs[0]
    except (SandboxUnavailableError, OSError) as error:
        program = SandboxResult(None, "", str(error), "it did not start")
    if program.stdout.strip() != "sandbox ok":
        raise SandboxUnavailableError(
            f"bubblewrap ({boundary.bwrap}) could not start a sandbox here ({program.reason}): "
            f"{program.stderr.strip()[-500:]!r}. It needs unprivileged user namespaces "
            "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone = 1, and "
            "no AppArmor/SELinux rule against them; in a container: a seccomp profile that "
            "allows unshare/clone of namespaces). The code environment does not fall back."
        )
    return boundary


def run_sandboxed(
    code: str, stdin: str = "", limits: SandboxLimits | None = None, first_filter: bool = True
) -> SandboxResult:
    """Run ``code`` as a program fed ``stdin`` in a fresh sandbox; never raises for what it does.

    ``first_filter=False`` leaves out the audit-hook filter, so tests can show that the
    boundary holds on its own.
    """
    limits = limits or SandboxLimits()
    return _run(require_sandbox(), code, [stdin], (), limits, None, first_filter).programs[0]


def run_sample(
    code: str,
    stdins: Sequence[str],
    asserts: Sequence[AssertTest],
    limits: SandboxLimits,
    judges: JudgePool,
) -> SampleResult:
    """Run ``code`` against its stdout tests (their stdins) and assert tests in one sandbox."""
    return _run(require_sandbox(), code, stdins, asserts, limits, judges, True)


def _rlimits(limits: SandboxLimits, cpu_s: int) -> dict[str, list[int]]:
    return {
        "RLIMIT_CPU": [cpu_s] * 2,
        "RLIMIT_AS": [limits.memory_mb << 20] * 2,
        "RLIMIT_FSIZE": [limits.output_bytes] * 2,
        "RLIMIT_NOFILE": [limits.max_open_files] * 2,
        "RLIMIT_NPROC": [limits.max_processes] * 2,
        "RLIMIT_CORE": [0, 0],
    }


def _run(
    boundary: Boundary,
    code: str,
    stdins: Sequence[str],
    asserts: Sequence[AssertTest],
    limits: SandboxLimits,
    judges: JudgePool | None,
    first_filter: bool,
) -> SampleResult:
    with contextlib.ExitStack() as stack:
        stdio = (memfd("stdin"), memfd("stdout"), memfd("stderr"))
        result = memfd("result")
        for fd in (*stdio, result):
            stack.callback(os.close, fd)
        job = {
            "source": code,
            "stdins": list(stdins),
            "serve": bool(asserts),
            "result_fd": result,
            "rlimits": _rlimits(limits, limits.cpu_time_s),
            "server_rlimits": _rlimits(limits, limits.cpu_time_s * max(1, len(asserts))),
            "first_filter": first_filter,
            "wall_time_s": limits.wall_time_s,
            "output_bytes": limits.output_bytes,
        }
        pass_fds: tuple[int, ...] = (result,)
        if asserts:  # requests from the judge to the sample, the sample's replies back
            requests, to_sample = os.pipe()
            from_sample, replies = os.pipe()
            job |= {"requests_fd": requests, "replies_fd": replies}
            pass_fds += (requests, replies)
        deadline = time.monotonic() + limits.wall_time_s * (len(stdins) + len(asserts) + 1)
        try:
            box = Box(
                boundary,
                "code_harness",
                job,
                memory_bytes=limits.memory_mb << 20,
                max_pids=limits.max_processes + 1,  # and the box's first process
                box_mb=limits.box_mb,
                stdio=stdio,
                pass_fds=pass_fds,
            )
        except BaseException:
            for fd in pass_fds[1:] + ((to_sample, from_sample) if asserts else ()):
                os.close(fd)
            raise
        stack.callback(box.close)
        verdicts: list[tuple[bool, str]] = []
        if asserts:
            os.close(requests)  # the box holds these two now
            os.close(replies)
            assert judges is not None, "assert tests need a JudgePool"
            verdicts = judges.verdicts(
                asserts, to_sample, from_sample, limits.wall_time_s, box, deadline
            )
        # Programs run to their end; a server whose judge is done has nothing left to say,
        # unless it ended on its own, and how it ended is the reason of its tests.
        ended_on_its_own = any(why == PROGRAM_ENDED for _, why in verdicts)
        waiting = not asserts or ended_on_its_own
        if not box.wait(max(0.0, deadline - time.monotonic()) if waiting else 0.0):
            box.kill()
        records = _records(result, len(stdins) + bool(asserts), limits.output_bytes)
        programs = tuple(
            _program_result(records[i] if i < len(records) else None, limits)
            for i in range(len(stdins))
        )
        if ended_on_its_own:
            server = records[len(stdins)] if len(records) > len(stdins) else None
            why = _ended_reason(server, stdio[2], limits)
            verdicts = [(ok, why if reason == PROGRAM_ENDED else reason) for ok, reason in verdicts]
        return SampleResult(programs, tuple(verdicts))


def _records(fd: int, count: int, output_bytes: int) -> list[tuple[dict, bytes, bytes]]:
    """The box's records (a JSON header line, stdout, stderr), read within size bounds.

    The box's processes could forge them: a malformed one ends the list.
    """
    data = os.pread(fd, count * (output_bytes + _STDERR_TAIL + 4096), 0)
    records: list[tuple[dict, bytes, bytes]] = []
    at = 0
    while len(records) < count and (end := data.find(b"\n", at, at + 4096)) >= 0:
        try:
            header = json.loads(data[at:end])
        except ValueError:
            break
        if not _well_formed(header, output_bytes):
            break
        stdout_end = end + 1 + header["stdout"]
        at = stdout_end + header["stderr"]
        records.append((header, data[end + 1 : stdout_end], data[stdout_end:at]))
    return records


def _well_formed(header: object, output_bytes: int) -> bool:
    kinds = {"status": int, "timed_out": bool, "capped": bool, "stdout": int, "stderr": int}
    return (
        type(header) is dict
        and set(header) == set(kinds)
        and all(type(header[key]) is kind for key, kind in kinds.items())
        and 0 <= header["stdout"] <= output_bytes
        and 0 <= header["stderr"] <= _STDERR_TAIL
    )


def _exit_code(status: int) -> int | None:
    """A wait status as a shell would report it: the exit code, or 128 + the signal."""
    try:
        code = os.waitstatus_to_exitcode(status)
    except ValueError:
        return None
    return 128 - code if code < 0 else code


def _program_result(
    record: tuple[dict, bytes, bytes] | None, limits: SandboxLimits
) -> SandboxResult:
    if record is None:
        why = f"wall time limit of {limits.wall_time_s:g}s exceeded (the sandbox was stopped)"
        return SandboxResult(None, "", "", why)
    header, stdout, stderr = record
    code = _exit_code(header["status"])
    reason = _reason(code, header["timed_out"], header["capped"], limits)
    text = (stdout.decode("utf-8", errors="replace"), stderr.decode("utf-8", errors="replace"))
    return SandboxResult(code, *text, reason)


def _reason(code: int | None, timed_out: bool, capped: bool, limits: SandboxLimits) -> str:
    if timed_out:
        return f"wall time limit of {limits.wall_time_s:g}s exceeded"
    if capped:
        return f"output limit of {limits.output_bytes} bytes exceeded"
    if code is not None and code > 128 and code - 128 in signal.valid_signals():
        return _signal_reason(code - 128, limits)
    return "" if code == 0 else f"exited with code {code}"


def _ended_reason(
    server: tuple[dict, bytes, bytes] | None, stderr: int, limits: SandboxLimits
) -> str:
    """Why a sample's assert tests got no answer: how its server ended, and its last words."""
    if server is None:
        why = f"wall time limit of {limits.wall_time_s:g}s exceeded (the sandbox was stopped)"
    else:
        code = _exit_code(server[0]["status"])
        why = _reason(code, False, False, limits) or f"{PROGRAM_ENDED} (an early exit?)"
    size = os.fstat(stderr).st_size
    tail = os.pread(stderr, _STDERR_TAIL, max(0, size - _STDERR_TAIL))
    lines = tail.decode("utf-8", errors="replace").strip().splitlines()
    return f"{why}: {lines[-1]}"[:300] if lines else why[:300]


def _signal_reason(signum: int, limits: SandboxLimits) -> str:
    name = signal.Signals(signum).name
    if signum == signal.SIGXFSZ:
        return f"output limit of {limits.output_bytes} bytes exceeded"
    if signum in (signal.SIGXCPU, signal.SIGKILL):
        return f"killed by {name} (CPU limit {limits.cpu_time_s}s or memory)"
    return f"killed by {name}"
