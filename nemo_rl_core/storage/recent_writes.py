"""The bytes of the stage outputs this process wrote last, for the stages that read them next.

On an object store a stage's output is uploaded, and the next stage in the same process
would download the same bytes again and hash them to check them: one round trip per input
(7-10 ms on the local S3 server, tens of ms on a cloud store) and the whole batch sent twice.
A reference names the bytes exactly (size and sha256), so the bytes this process hashed
when it wrote them are the ones the reference asks for.
"""

import threading
from collections import OrderedDict
from typing import Any


class RecentWrites:
    """Up to ``max_bytes`` of the newest objects written, by key and sha256; the oldest go
    first. Thread-safe: rollouts of later iterations may run beside training."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._objects: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def remember(self, key: str, sha256: str, data: Any) -> None:
        """Keep ``data`` (bytes-like, never changed afterwards) as the object at ``key``."""
        with self._lock:
            self._drop(key)
            if len(data) > self.max_bytes:
                return
            self._objects[key] = (sha256, data)
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._objects)))

    def discard(self, key: str) -> None:
        """Forget the object at ``key``: something else was written there."""
        with self._lock:
            self._drop(key)

    def get(self, key: str, size: int, sha256: str) -> Any | None:
        """The bytes written at ``key`` if they are the ones of this size and sha256."""
        with self._lock:
            found = self._objects.get(key)
            if found is None or found[0] != sha256 or len(found[1]) != size:
                return None
            self._objects.move_to_end(key)
            return found[1]

    def forget(self) -> None:
        """Drop everything: the next reads go to the store (a new flow run checks what is
        stored, e.g. an input damaged since)."""
        with self._lock:
            self._objects.clear()
            self._bytes = 0

    def _drop(self, key: str) -> None:
        found = self._objects.pop(key, None)
        if found is not None:
            self._bytes -= len(found[1])
