"""What runs inside the sandbox before and around a sample: standard library only.

``code_sandbox`` runs this file's source as ``python -I -S -B -c SOURCE JOB_FD RESULT_FD``.
The harness reads its job (the sample's source, the probes, the rlimits, a per-run nonce;
marshalled by the parent) from JOB_FD and closes it before the sample runs, sets the
rlimits, installs a cheap audit-hook filter, then either runs the sample as a program
(stdout tests) or runs it as a module and evaluates each probe expression, reporting typed
plain values (``encode_plain``) as JSON (``dump_json``) on RESULT_FD. It imports only fast
modules (``json`` alone would add ~7 ms, a fifth of a run: hence ``marshal`` and ``dump_json``).

Nothing here is a boundary: the sample shares this process and can tamper with it (it can
even read the nonce from the harness's frames). The parent trusts only what it checks: the
nonce (which keeps stray writes out), that the report decodes to plain values
(``decode_plain``), and its own comparisons against expected values that never enter the
sandbox. An early exit, ``SystemExit`` or a value that is not plain is a failure there.
"""

import builtins
import marshal
import math
import os
import resource
import sys
from _json import encode_basestring_ascii

_SEQUENCES: dict[type, str] = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}
_CONSTRUCTORS = {tag: kind for kind, tag in _SEQUENCES.items()}
_MAX_DEPTH = 100
# Audit events the first filter refuses: process creation, sockets, native code, signals,
# gc and tracing. The sandbox contains all of these without it; the filter only fails such
# samples early with a clear reason. (Frames stay reachable: namedtuple and enum need
# sys._getframe, and traceback printing needs tb_frame.)
_BLOCKED_EVENTS = (
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.spawn",
    "os.exec",
    "os.system",
    "subprocess.",
    "socket.",
    "ctypes.",
    "os.kill",
    "os.setsid",
    "pty.",
    "gc.get_",
    "sys._current_frames",
    "sys.setprofile",
    "sys.settrace",
    "resource.setrlimit",
)
_BLOCKED_IMPORTS = frozenset({"ctypes", "_ctypes", "gc", "_xxsubinterpreters"})


def encode_plain(value: object, depth: int = 0) -> object:
    """A JSON-ready copy of ``value`` made of exact built-in types, tagged where JSON is not.

    Subclasses are refused (``type(x) is int``, never ``isinstance``): a ``str`` whose
    ``__str__`` lies or an object whose ``__eq__`` is always true is not a plain value.
    """
    kind = type(value)
    if depth > _MAX_DEPTH:
        raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    # ``kind in _SEQUENCES`` refuses subclasses; isinstance only tells the type checker.
    if kind in _SEQUENCES and isinstance(value, list | tuple | set | frozenset):
        return {_SEQUENCES[kind]: [encode_plain(item, depth + 1) for item in value]}
    if type(value) is dict:
        return {
            "dict": [
                [encode_plain(k, depth + 1), encode_plain(v, depth + 1)] for k, v in value.items()
            ]
        }
    if type(value) is bytes:
        return {"bytes": value.hex()}
    raise TypeError(
        f"a value of type {kind.__name__} is not plain "
        "(None, bool, int, float, str, bytes, list, tuple, set, frozenset or dict)"
    )


def decode_plain(data: object, depth: int = 0) -> object:
    """The value ``encode_plain`` encoded; ValueError for anything it cannot have written."""
    kind = type(data)
    if depth > _MAX_DEPTH:
        raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
    if data is None or kind in (bool, int, float, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"unexpected {kind.__name__} in a plain-value report")
    ((tag, body),) = data.items()
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ValueError(f"malformed {tag!r} in a plain-value report")
    try:
        if tag == "dict":
            if not all(type(pair) is list and len(pair) == 2 for pair in body):
                raise ValueError("malformed 'dict' in a plain-value report")
            return {decode_plain(k, depth + 1): decode_plain(v, depth + 1) for k, v in body}
        if tag in _CONSTRUCTORS:
            return _CONSTRUCTORS[tag](decode_plain(item, depth + 1) for item in body)
    except TypeError as error:  # an unhashable key or set member
        raise ValueError(f"malformed {tag!r} in a plain-value report: {error}") from None
    raise ValueError(f"unknown tag {tag!r} in a plain-value report")


def dump_json(data: object) -> str:
    """JSON text of ``encode_plain``'s output (None, bool, int, finite float, str, list, dict)."""
    if data is None or data is True or data is False:
        return "null" if data is None else "true" if data else "false"
    kind = type(data)
    if type(data) is int:
        return int.__repr__(data)
    if type(data) is float:
        return float.__repr__(data)
    if type(data) is str:
        return encode_basestring_ascii(data)
    if type(data) is list:
        return "[" + ",".join([dump_json(item) for item in data]) + "]"
    if type(data) is dict:
        pairs = [
            encode_basestring_ascii(key) + ":" + dump_json(value) for key, value in data.items()
        ]
        return "{" + ",".join(pairs) + "}"
    raise TypeError(f"cannot write a {kind.__name__} as JSON")


def _install_first_filter() -> None:
    """Refuse the audit events above; the closure keeps its own references to what it calls."""
    startswith, join = str.startswith, str.join

    def guard(event: str, args: tuple) -> None:
        if startswith(event, _BLOCKED_EVENTS):
            raise PermissionError(f"sandbox: {event} is not allowed")
        # join copies a str subclass's characters without calling its methods
        if event == "import" and join("", (args[0],)) in _BLOCKED_IMPORTS:
            raise PermissionError(f"sandbox: import of {args[0]} is not allowed")

    sys.addaudithook(guard)


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 -- the sample's exception may raise from __str__
        text = ""
    return f"{type(error).__name__}: {text}"[:300]


def _evaluate_probes(source: str, probes: list[str]) -> list[dict]:
    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as error:  # noqa: BLE001 -- SystemExit too: an early exit fails
        return [{"error": f"the solution raised {_describe(error)}"}] * len(probes)
    results = []
    for probe in probes:
        try:
            results.append({"value": encode_plain(eval(probe, namespace))})
        except BaseException as error:  # noqa: BLE001
            results.append({"error": f"{probe} raised {_describe(error)}"})
    return results


def main() -> None:
    """Run one job; in probe mode report and exit at once, so no exit handler of the sample runs."""
    job_fd, result_fd = int(sys.argv[1]), int(sys.argv[2])
    with os.fdopen(job_fd, "rb") as handle:
        job = marshal.loads(handle.read())
    # Set before the sample runs, inherited by all it starts, never raised again (no
    # capabilities). NPROC counts per user namespace: this run's processes and threads only.
    # CPU's soft and hard limits are equal: as pid 1 the harness would ignore SIGXCPU.
    for name, (soft, hard) in job["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    write, exit_now = os.write, os._exit
    sys.argv = ["solution.py"]
    if job["first_filter"]:
        _install_first_filter()
    if job["probes"] is None:
        os.close(result_fd)
        exec(compile(job["source"], "solution.py", "exec"), {"__name__": "__main__"})
        return
    results = _evaluate_probes(job["source"], job["probes"])
    report = (job["nonce"] + "\n" + dump_json({"results": results})).encode()
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 -- contextlib would cost an import
            stream.flush()
        except Exception:  # noqa: BLE001 -- the sample may have closed or replaced it
            pass
    while report:
        report = report[write(result_fd, report) :]
    exit_now(0)


if __name__ == "__main__":
    main()
