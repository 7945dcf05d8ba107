"""The judge: the one place an assert test runs, where no sample can reach it.

Runs long-lived in a sandbox of its own (``sandbox_judge``), loaded from source, standard
library only. For each sample the host sends the sample's assert tests and the two ends
of a pipe pair to the sample's box (``code_harness.serve``). Each assert's expression is
evaluated here with the real builtins and ``math``: its expected side (literals,
operators, builtins, comprehensions, method calls) never leaves this process. Each name
of the solution it uses stands for the sample's object (``SolutionObject``): calling it or
reading its attributes asks the box, which answers with a plain value (decoded here) or a
reference. No object of the sample runs here: comparing, hashing, truth-testing or
formatting a reference fails the test, as a value that is not plain.

The host bounds this process's CPU per sample (decoding a crafted set can take quadratic
time) and kills it past that; the per-test wall time is kept here.
"""

import builtins
import json
import marshal
import math
import os
import resource
import select
import socket
import time
from collections.abc import Callable
from types import CodeType

from .code_plain import (
    PROGRAM_ENDED,
    decode_plain,
    encode_plain,
    read_exactly,
    read_frame,
    write_frame,
)

_MISSING = object()


class ChannelError(BaseException):
    """The sample's box stopped answering (ended, timed out or broke the protocol).

    A BaseException, so that no expression of a test can catch it.
    """


class ChannelTimeout(ChannelError):
    """A test ran past its wall time."""


class SolutionError(Exception):
    """What the solution raised when the judge called it."""


class Channel:
    """Requests to one sample's box and its answers, within a test's deadline."""

    def __init__(self, requests: int, replies: int, limit: int) -> None:
        self.requests, self.replies, self.limit = requests, replies, limit
        self.deadline: float | None = None
        self._objects: dict[str, SolutionObject] = {}
        os.set_blocking(requests, False)

    def _wait_for(self, fd: int, event: int) -> None:
        poller = select.poll()
        poller.register(fd, event)
        timeout = None if self.deadline is None else self.deadline - time.monotonic()
        if not poller.poll(None if timeout is None else max(0, int(timeout * 1000))):
            raise ChannelTimeout("timed out")

    def _read(self) -> dict:
        try:
            frame = read_frame(
                self.replies, self.limit, lambda: self._wait_for(self.replies, select.POLLIN)
            )
        except ValueError as error:
            raise ChannelError(f"the sandbox broke the protocol: {error}") from None
        if frame is None:
            raise ChannelError(PROGRAM_ENDED)
        try:
            data = json.loads(frame)
        except (ValueError, RecursionError) as error:
            raise ChannelError(f"the sandbox broke the protocol: {error}"[:300]) from None
        if type(data) is not dict:
            raise ChannelError("the sandbox broke the protocol: an answer that is not an object")
        if type(data.get("fatal")) is str:
            raise ChannelError(data["fatal"][:300])
        return data

    def wait_started(self) -> None:
        """The box's first frame: its stdout tests are done and its server is starting."""
        if self._read() != {"started": True}:
            raise ChannelError("the sandbox broke the protocol: no start")

    def _exchange(self, request: tuple) -> dict:
        data = len(payload := marshal.dumps(request)).to_bytes(4, "big") + payload
        try:
            while data:
                self._wait_for(self.requests, select.POLLOUT)
                data = data[os.write(self.requests, data) :]
        except (BrokenPipeError, BlockingIOError):
            raise ChannelError(PROGRAM_ENDED) from None
        return self._read()

    def _refer(self, value: object) -> dict:
        if isinstance(value, SolutionObject) and value._channel is self:
            return {"ref": value._ref}
        raise TypeError(
            f"a {type(value).__name__} cannot be passed to the solution: only plain values "
            "and the solution's own objects"
        )

    def _result(self, reply: dict) -> object:
        if set(reply) == {"value"}:
            try:
                return decode_plain(reply["value"])
            except (ValueError, RecursionError) as error:
                raise ChannelError(f"the sandbox sent a malformed value: {error}"[:300]) from None
        if set(reply) == {"ref", "why"} and type(reply["ref"]) is int:
            return SolutionObject(self, reply["ref"], str(reply["why"])[:300])
        if set(reply) == {"error"} and type(reply["error"]) is str:
            raise SolutionError(reply["error"][:300])
        raise ChannelError("the sandbox broke the protocol: an unexpected answer")

    def lookup(self, name: str) -> object:
        """The solution's ``name``: its objects once per sample, its plain values per test
        (a test may change its copy)."""
        if name in self._objects:
            return self._objects[name]
        reply = self._exchange(("name", name))
        value = _MISSING if reply == {"missing": name} else self._result(reply)
        if isinstance(value, SolutionObject):
            self._objects[name] = value
        return value

    def attribute(self, ref: int, name: str) -> object:
        return self._result(self._exchange(("attr", ref, name)))

    def call(self, ref: int, args: tuple, kwargs: dict) -> object:
        encoded = (
            encode_plain(list(args), refer=self._refer),
            encode_plain(kwargs, refer=self._refer),
        )
        return self._result(self._exchange(("call", ref, *encoded)))


class SolutionObject:
    """The judge's stand-in for an object of the sample that is not a plain value."""

    __slots__ = ("_channel", "_ref", "_why")

    def __init__(self, channel: Channel, ref: int, why: str) -> None:
        self._channel, self._ref, self._why = channel, ref, why

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._channel.call(self._ref, args, kwargs)

    def __getattr__(self, name: str) -> object:
        # Python's own protocols (==, hash, bool, len, iter, str, ...) look their special
        # methods up on this class, never here: only explicit reads reach the sample.
        return self._channel.attribute(self._ref, name)

    def __repr__(self) -> str:
        return f"<the solution's value: {self._why}>"

    def _refuse(self, *args: object) -> bool:
        raise TypeError(f"the solution's value is not plain ({self._why})")

    # What Python would otherwise answer for any object, decided here: never.
    __eq__ = __ne__ = __bool__ = __str__ = __format__ = _refuse  # type: ignore[assignment]
    __hash__ = _refuse


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def judge_test(
    test: dict, channel: Channel, compiled: Callable[[str], CodeType]
) -> tuple[bool, str]:
    """(passed, why) for one assert test: names looked up in the box, asserts judged here."""
    namespace: dict = {"__builtins__": builtins, "math": math}
    text = ""
    try:
        for name in test["names"]:
            if (value := channel.lookup(name)) is not _MISSING:
                namespace[name] = value
        for text, source in test["asserts"]:
            if not eval(compiled(source), namespace):  # noqa: S307 -- the dataset's test, here
                return False, f"assertion failed: {text}"[:300]
    except SolutionError as error:
        return False, f"{text or 'a name'}: the solution raised {error}"[:300]
    except Exception as error:  # noqa: BLE001 -- e.g. len() of an int the sample returned
        return False, f"{text} raised {_describe(error)}"[:300]
    return True, "passed"


def judge_sample(request: dict, channel: Channel) -> list[list]:
    """[passed, why] per assert test of one sample, in order."""
    cache: dict[str, CodeType] = {}

    def compiled(source: str) -> CodeType:
        if source not in cache:
            cache[source] = compile(source, "<assert>", "eval")
        return cache[source]

    verdicts: list[list] = []
    stopped = ""
    try:
        channel.wait_started()
    except ChannelError as error:
        stopped = str(error)
    for index, test in enumerate(request["tests"]):
        if stopped:
            verdicts.append([False, stopped])
            continue
        channel.deadline = time.monotonic() + request["wall_time_s"]
        try:
            verdicts.append(list(judge_test(test, channel, compiled)))
        except ChannelTimeout:
            verdicts.append([False, f"wall time limit of {request['wall_time_s']:g}s exceeded"])
            stopped = f"not judged: the program was still busy with test {index}"
        except ChannelError as error:
            stopped = str(error)
            verdicts.append([False, stopped])
    return verdicts


def main(job: dict) -> None:
    """Judge one sample per request from the host until the host hangs up."""
    for name, (soft, hard) in job["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    control = socket.socket(fileno=job["control_fd"])
    while True:
        header, fds, _, _ = socket.recv_fds(control, 4, 2)
        if len(header) < 4 or len(fds) != 2:
            return  # the host hung up
        body = read_exactly(control.fileno(), int.from_bytes(header, "big"))
        if body is None:
            return
        channel = Channel(fds[0], fds[1], job["output_bytes"])
        try:
            verdicts = judge_sample(marshal.loads(body), channel)
        finally:
            for fd in fds:
                os.close(fd)
        write_frame(control.fileno(), json.dumps(verdicts).encode())
