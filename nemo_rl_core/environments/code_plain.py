"""Plain values and frames: what crosses between a sample's sandbox and its judge.

Runs inside the sandboxes (``code_harness`` in a sample's box, ``code_judge`` in the
judge's), so it uses the standard library only and imports nothing of this package; the
boxes load it from source (``sandbox_box.BOOTSTRAP``).

A plain value is made of exact built-in types (``type(x) is int``, never ``isinstance``):
None, bool, int, float, str, bytes, list, tuple, set, frozenset and dict. ``encode_plain``
tags what JSON cannot hold, ``dump_json`` writes it without importing ``json`` (which
would cost a sample's box ~7 ms), and ``decode_plain`` rebuilds it in the judge, whose CPU
the host bounds: decoding is where a crafted set can cost quadratic time.
"""

import math
import os
from _json import encode_basestring_ascii
from collections.abc import Callable

_SEQUENCES: dict[type, str] = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}
_CONSTRUCTORS = {tag: kind for kind, tag in _SEQUENCES.items()}
_MAX_DEPTH = 100
_HEADER = 4  # bytes of a frame's big-endian length
# The judge's reason when a sample's box stops answering; the host, which knows how the
# box ended, says more (code_sandbox).
PROGRAM_ENDED = "the program ended before answering"


def encode_plain(
    value: object, depth: int = 0, refer: Callable[[object], dict] | None = None
) -> object:
    """A JSON-ready copy of ``value`` made of exact built-in types, tagged where JSON is not.

    Subclasses are refused: a ``str`` whose ``__str__`` lies or an object whose ``__eq__``
    is always true is not a plain value. ``refer`` encodes what is not plain (the judge
    passes the sample's own objects back to it as references); without it, TypeError.
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
        return {_SEQUENCES[kind]: [encode_plain(item, depth + 1, refer) for item in value]}
    if type(value) is dict:
        return {
            "dict": [
                [encode_plain(k, depth + 1, refer), encode_plain(v, depth + 1, refer)]
                for k, v in value.items()
            ]
        }
    if type(value) is bytes:
        return {"bytes": value.hex()}
    if refer is not None:
        return refer(value)
    raise TypeError(
        f"a value of type {kind.__name__} is not plain "
        "(None, bool, int, float, str, bytes, list, tuple, set, frozenset or dict)"
    )


def decode_plain(
    data: object, depth: int = 0, resolve: Callable[[object], object] | None = None
) -> object:
    """The value ``encode_plain`` encoded; ValueError for anything it cannot have written.

    ``resolve`` turns a ``{"ref": n}`` back into the object it names (the sample's side);
    without it a reference is malformed.
    """
    kind = type(data)
    if depth > _MAX_DEPTH:
        raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
    if data is None or kind in (bool, int, float, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"unexpected {kind.__name__} in a plain value")
    ((tag, body),) = data.items()
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "ref" and resolve is not None:
        return resolve(body)
    if type(body) is not list:
        raise ValueError(f"malformed {tag!r} in a plain value")
    try:
        if tag == "dict":
            if not all(type(pair) is list and len(pair) == 2 for pair in body):
                raise ValueError("malformed 'dict' in a plain value")
            return {
                decode_plain(k, depth + 1, resolve): decode_plain(v, depth + 1, resolve)
                for k, v in body
            }
        if tag in _CONSTRUCTORS:
            return _CONSTRUCTORS[tag](decode_plain(item, depth + 1, resolve) for item in body)
    except TypeError as error:  # an unhashable key or set member
        raise ValueError(f"malformed {tag!r} in a plain value: {error}") from None
    raise ValueError(f"unknown tag {tag!r} in a plain value")


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


def write_frame(fd: int, payload: bytes) -> None:
    """Write ``payload`` behind its length; a frame is the unit of every exchange."""
    data = len(payload).to_bytes(_HEADER, "big") + payload
    while data:
        data = data[os.write(fd, data) :]


def read_exactly(fd: int, size: int, wait: Callable[[], None] | None = None) -> bytes | None:
    """``size`` bytes from ``fd``, or None at end of file; ``wait`` runs before each read."""
    chunks, left = [], size
    while left:
        if wait is not None:
            wait()
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, limit: int, wait: Callable[[], None] | None = None) -> bytes | None:
    """The next frame's payload, None at end of file; ValueError past ``limit`` bytes."""
    header = read_exactly(fd, _HEADER, wait)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, over the limit of {limit}")
    return read_exactly(fd, size, wait)
