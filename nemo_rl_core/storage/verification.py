"""The check of a whole stored run against its records: every output of every entry of
every iteration (complete or stale, stages and their parts) and every file of every
committed checkpoint, each read back and compared with its recorded size and sha256.

A stale entry (a rerun marked it to be redone) is checked too, and said to be stale: the
next continue recomputes it, but until then its bytes are what a rerun of a later stage
or a person reads, and a flipped byte there is damage like any other.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from nemo_rl_core.storage.checkpoint_store import CheckpointStore
from nemo_rl_core.storage.layout import manifest_key
from nemo_rl_core.storage.manifest_store import ManifestStore
from nemo_rl_core.storage.object_store import IntegrityError, ObjectRef, ObjectStore
from nemo_rl_core.storage.outage import StorageError

T = TypeVar("T")


@dataclass(frozen=True)
class RunCheck:
    """What a check of a run found: one line per damaged object (or unreadable record),
    one per stale entry, and how many objects were read back."""

    damaged: list[str]
    stale: list[str]
    checked: int

    @property
    def intact(self) -> bool:
        return not self.damaged

    def verdict(self) -> str:
        stale = f" (stale entries among them: {len(self.stale)})" if self.stale else ""
        found = f"{len(self.damaged)} damaged" if self.damaged else "every one intact"
        return f"{self.checked} objects checked{stale}: {found}"


class DamagedRunError(IntegrityError):
    """A run whose check found damage; ``check`` holds every finding."""

    def __init__(self, message: str, check: RunCheck) -> None:
        super().__init__(message)
        self.check = check


def check_run(
    objects: ObjectStore,
    manifests: ManifestStore,
    checkpoints: CheckpointStore,
) -> RunCheck:
    """Read back every object the run recorded and compare it with its record."""
    damaged: list[str] = []
    stale: list[str] = []
    checked = 0

    def check(refs: list[ObjectRef], where: str) -> int:
        for ref in refs:
            if (problem := objects.problem(ref)) is not None:
                damaged.append(f"{problem} ({where})")
        return len(refs)

    for iteration in manifests.iterations():
        url = objects.url(manifest_key(iteration))
        entries = _readable(partial(manifests.recorded_entries, iteration), url, damaged)
        for label, entry in entries or []:
            where = f"iteration {iteration} stage {label}"
            if not entry.complete:
                where += ", a stale entry: the next continue recomputes it"
            count = check(list(entry.outputs.values()), where)
            if not entry.complete:
                stale.append(
                    f"iteration {iteration} stage {label}: stale (marked to be redone), "
                    f"{count} output(s) checked"
                )
            checked += count
    for step in checkpoints.committed_checkpoints():
        where = f"committed checkpoint {step}"
        files = _readable(partial(checkpoints.recorded_files, step), where, damaged)
        checked += check(files or [], where)
    return RunCheck(damaged, stale, checked)


def _readable(read: Callable[[], T], what: str, damaged: list[str]) -> T | None:
    """``read()``, or None with a line in ``damaged`` if its record cannot be read."""
    try:
        return read()
    except (StorageError, ValueError) as exc:  # IntegrityError is a StorageError
        damaged.append(f"{what}: its record cannot be read: {exc}")
        return None
