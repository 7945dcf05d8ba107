"""The one rule for names on storage (run ids, stages, objects), apart from the storage
layer itself, which loads torch and pyarrow: the command line checks ``--run-id`` first.
"""

import re

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
# A run id, stage or object name is one path segment: local file systems take 255 bytes a
# component; the rest of a key (root, iter_/step_ folders, file names) needs room too.
MAX_NAME_LENGTH = 128


def validate_name(kind: str, value: str) -> str:
    """Check a run id, stage or object name: one path segment of [A-Za-z0-9._-] of at most
    ``MAX_NAME_LENGTH`` characters, no '..'."""
    if isinstance(value, str) and len(value) > MAX_NAME_LENGTH:
        raise ValueError(
            f"invalid {kind} {value[:40]!r}...: {len(value)} characters, at most "
            f"{MAX_NAME_LENGTH} (every store must accept it as one path segment)"
        )
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value in (".", ".."):
        raise ValueError(
            f"invalid {kind} {value!r}: use only letters, digits, '.', '_' and '-' "
            f"(one path segment, not '.' or '..')"
        )
    if ".." in value:
        raise ValueError(f"invalid {kind} {value!r}: '..' is not allowed")
    return value
