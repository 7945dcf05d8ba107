"""The judge's sandbox, seen from the host: long-lived, one per sample in flight, and never
allowed more than ``JUDGE_CPU_S`` of CPU for one sample.

A sample's answers reach the judge (``code_judge``) straight from its box through a pipe
pair that this process creates and hands over; this process never decodes a sample's
value. A crafted answer can make decoding or comparing take quadratic time (integers
whose hashes collide, in a set), so while a sample is judged the host reads the judge's
CPU time from ``/proc`` and kills the judge past the bound: that sample's tests fail,
the next sample gets a fresh judge.
"""

import json
import marshal
import os
import socket
import threading
import time
from collections.abc import Sequence

from nemo_rl_core.environments.code_assertions import AssertTest
from nemo_rl_core.environments.code_plain import read_frame
from nemo_rl_core.environments.sandbox_box import Box, memfd, readable
from nemo_rl_core.environments.sandbox_host import Boundary

JUDGE_CPU_S = 1.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_VERDICTS_BYTES = 1 << 20


class Judge:
    """One judge sandbox and the control socket it takes requests on."""

    def __init__(self, boundary: Boundary, memory_bytes: int, output_bytes: int) -> None:
        self._control, judge_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._stdio = (memfd("stdin"), memfd("stdout"), memfd("stderr"))
        rlimits = {
            "RLIMIT_AS": [memory_bytes] * 2,
            "RLIMIT_FSIZE": [output_bytes] * 2,
            "RLIMIT_NOFILE": [64] * 2,
            "RLIMIT_CORE": [0, 0],
        }
        job = {"control_fd": judge_end.fileno(), "output_bytes": output_bytes, "rlimits": rlimits}
        try:
            self._box = Box(
                boundary,
                "code_judge",
                job,
                memory_bytes=memory_bytes,
                max_pids=4,
                box_mb=1,
                stdio=self._stdio,
                pass_fds=(judge_end.fileno(),),
            )
        except BaseException:
            self._close_fds()
            raise
        finally:
            judge_end.close()
        self._tests = 0
        self._cpu_start = 0.0

    def alive(self) -> bool:
        return not self._box.ended()

    def begin(
        self, tests: Sequence[AssertTest], requests: int, replies: int, wall_s: float
    ) -> None:
        """Send one sample's tests and the judge's ends of its pipes; OSError if it is gone."""
        request = {
            "tests": [
                {"names": list(t.names), "asserts": [list(a) for a in t.asserts]} for t in tests
            ],
            "wall_time_s": wall_s,
        }
        payload = marshal.dumps(request)
        socket.send_fds(self._control, [len(payload).to_bytes(4, "big")], [requests, replies])
        self._control.sendall(payload)
        self._tests = len(tests)
        self._cpu_start = self._cpu_seconds()

    def verdicts(self, wait_s: float) -> list[tuple[bool, str]] | None:
        """The verdicts once the judge sends them (None while it works, at most ``wait_s``).

        Past ``JUDGE_CPU_S`` of CPU on this sample, or if it died, the judge is closed and
        every test fails: the pool starts another for the next sample.
        """
        if readable(self._control.fileno(), wait_s):
            try:
                return self._read_verdicts()
            except (ValueError, OSError) as error:
                return self._fail(f"the judge failed: {error}")
        if self._cpu_seconds() - self._cpu_start > JUDGE_CPU_S:
            return self._fail(
                f"judging took over {JUDGE_CPU_S:g}s of CPU (values too large or too costly "
                "to compare)"
            )
        if not self.alive():
            return self._fail("the judge failed")
        return None

    def _read_verdicts(self) -> list[tuple[bool, str]]:
        frame = read_frame(self._control.fileno(), _VERDICTS_BYTES)
        data = json.loads(frame) if frame is not None else None
        if type(data) is not list or len(data) != self._tests:
            raise ValueError("no verdict for every test")
        if not all(
            type(v) is list and len(v) == 2 and type(v[0]) is bool and type(v[1]) is str
            for v in data
        ):
            raise ValueError("malformed verdicts")
        return [(ok, why) for ok, why in data]

    def _fail(self, why: str) -> list[tuple[bool, str]]:
        tail = os.pread(self._stdio[2], 2000, 0).decode(errors="replace").strip().splitlines()
        self.close()
        detail = f": {tail[-1]}" if tail and why == "the judge failed" else ""
        return [(False, f"{why}{detail}"[:300])] * self._tests

    def _cpu_seconds(self) -> float:
        try:
            with open(f"/proc/{self._box.pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime + stime

    def _close_fds(self) -> None:
        self._control.close()
        for fd in self._stdio:
            os.close(fd)

    def close(self) -> None:
        if self._control.fileno() >= 0:
            self._box.close()
            self._close_fds()


class JudgePool:
    """Judges for concurrent samples: started on first need, reused, replaced when closed."""

    def __init__(self, boundary: Boundary, memory_bytes: int, output_bytes: int) -> None:
        self._settings = (boundary, memory_bytes, output_bytes)
        self._idle: list[Judge] = []
        self._lock = threading.Lock()

    def verdicts(
        self,
        tests: Sequence[AssertTest],
        requests: int,
        replies: int,
        wall_s: float,
        box: Box,
        deadline: float,
    ) -> list[tuple[bool, str]]:
        """Judge ``box``'s sample through the pipe ends given (closed here); the box is
        killed at ``deadline``, and the judge then reads the end of its answers."""
        try:
            judge = self._begin(tests, requests, replies, wall_s)
        finally:
            os.close(requests)
            os.close(replies)
        try:
            while True:
                remaining = deadline - time.monotonic()
                verdicts = judge.verdicts(min(0.05, remaining) if remaining > 0 else 0.05)
                if verdicts is not None:
                    return verdicts
                if remaining <= 0:
                    box.kill()
        finally:
            if judge.alive():
                with self._lock:
                    self._idle.append(judge)
            else:
                judge.close()

    def _begin(
        self, tests: Sequence[AssertTest], requests: int, replies: int, wall_s: float
    ) -> Judge:
        """An idle judge (or a new one) that took the sample."""
        with self._lock:
            judge = self._idle.pop() if self._idle else None
        if judge is not None and judge.alive():
            try:
                judge.begin(tests, requests, replies, wall_s)
                return judge
            except OSError:  # it died between its check and the request
                pass
        if judge is not None:
            judge.close()
        judge = Judge(*self._settings)
        try:
            judge.begin(tests, requests, replies, wall_s)
        except BaseException:
            judge.close()
            raise
        return judge

    def close(self) -> None:
        with self._lock:
            judges, self._idle = self._idle, []
        for judge in judges:
            judge.close()
