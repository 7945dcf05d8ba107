"""Local copies of committed checkpoints that a reader can trust while it reads them.

A process that loads a checkpoint from an object store (or from a run it must not hold
open) copies it to a local folder first. Under async GRPO two threads ask for the same
step (the rollout thread's refit and the flow thread's policy), and a copy written over
the files another thread was reading tore them (issue 34). So a copy is made once, in a
fresh folder of its own, checked against the size and sha256 of every file its
``training_info.json`` records, and only then renamed to the name readers use: a reader
sees the whole, verified copy or no folder at all. A copy a killed process left half
made never gets that name; one found there that no longer matches is made again.
"""

import hashlib
import shutil
import tempfile
from pathlib import Path

from nemo_rl_core.storage.run_storage import IntegrityError, RunStorage
from nemo_rl_core.utils.checkpoint import TrainingInfo, file_digests


def checkpoint_copy(storage: RunStorage, step: int, info: TrainingInfo, target: Path) -> Path:
    """``target`` holding checkpoint ``step`` as ``info`` records its files: kept if it
    already does, else fetched into a fresh sibling folder, verified and renamed onto it.
    A stored file that differs from its record raises ``IntegrityError`` naming it."""
    if target.is_dir() and not _differences(target, info):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        storage.fetch_checkpoint(step, fresh)
        if problems := _differences(fresh, info):
            raise IntegrityError(
                f"checkpoint step {step} of {storage.run_url} does not match its "
                f"training_info.json: {'; '.join(problems)}. The stored checkpoint is damaged; "
                "`python -m flows.verify` lists every damaged object of the run"
            )
        shutil.rmtree(target, ignore_errors=True)  # a half-made or damaged older copy
        try:
            fresh.rename(target)
        except OSError:
            if not target.is_dir():  # else another fetcher placed its verified copy first
                raise
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return target


def _differences(folder: Path, info: TrainingInfo) -> list[str]:
    """How ``folder`` differs from the files ``info`` records (missing, another size,
    another sha256), one line each; empty when every recorded file is there, whole."""
    problems, to_hash = [], []
    for name, recorded in sorted(info.files.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif (size := path.stat().st_size) != recorded.size:
            problems.append(f"{name} has {size} bytes, recorded {recorded.size}")
        else:
            to_hash.append(name)
    digests = file_digests([folder / name for name in to_hash])
    for name, digest in zip(to_hash, digests, strict=True):
        if digest != info.files[name].sha256:
            problems.append(f"{name} has sha256 {digest}, recorded {info.files[name].sha256}")
    return problems


def copy_name(step: int, info: TrainingInfo) -> str:
    """A folder name for the copy of checkpoint ``step`` with these files: a step committed
    again with other contents gets a copy of its own, never one written over the first."""
    record = "".join(f"{name}:{f.sha256}\n" for name, f in sorted(info.files.items()))
    return f"step_{step}-{hashlib.sha256(record.encode()).hexdigest()[:16]}"
