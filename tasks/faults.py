"""Fault injection for the reliability tests: the one place that reads ``NEMO_RL_CORE_FAULT``.

``NEMO_RL_CORE_FAULT=stage@iteration[:mode],...`` asks one stage of one iteration (a refill
round ``reward.2`` and a shard ``reward/shard-0-of-2`` are stages of their own here) for a
fault at one of the three points of ``run_stage``:

- before compute: ``raise`` (the default) fails the stage; ``stall`` hangs in its work for
  ``STALL_SECONDS``, as a stuck backend does, ``stall<s>`` for s seconds, as a slow one does;
- in compute, on one rank of a stage run across processes: ``kill-rank<r>`` has rank r
  SIGKILL itself in its first backward pass, while its peers wait for it in the step's
  collectives (once per run: a rendezvous note on storage says it fired);
- after compute: ``kill`` SIGKILLs the process (with its children) before the outputs are
  committed, like a worker lost in the middle of a stage;
- after commit: ``damage`` flips one byte of each committed output (once per run: not again
  once the manifest records its repair), so the next stage reads an object that no longer
  matches the manifest.

Only public storage calls: the damaged bytes are written by the run's object layer
(``storage.objects``), below the manifest, which is what "behind its back" means here.
"""

import contextlib
import os
import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from nemo_rl_core.storage.run_storage import ObjectRef, RunStorage

FAULT_ENV = "NEMO_RL_CORE_FAULT"
STALL_SECONDS = 600.0  # a stalled stage outlasts any timeout a test sets
MODES = ("raise", "stall", "stall<s>", "kill", "damage", "kill-rank<r>")
_MODE_RE = re.compile(r"raise|stall\d*|kill|damage|kill-rank\d+")
FAULT_NOTES = "injected-faults"  # the rendezvous notes of rank kills that fired


class InjectedFault(RuntimeError):
    """Raised where ``NEMO_RL_CORE_FAULT`` asks for a failure (fault-injection tests)."""


@dataclass(frozen=True)
class StageFaults:
    """The faults ``NEMO_RL_CORE_FAULT`` asks of one stage (``label``) of one iteration."""

    label: str
    iteration: int
    modes: frozenset[str]

    @classmethod
    def asked(cls, label: str, iteration: int) -> "StageFaults":
        modes = set()
        for item in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
            target, _, mode = item.partition(":")
            if mode and not _MODE_RE.fullmatch(mode):
                raise ValueError(f"{FAULT_ENV}: unknown mode {mode!r} in {item!r}; use {MODES}")
            if target == f"{label}@{iteration}":
                modes.add(mode or "raise")
        return cls(label, iteration, frozenset(modes))

    def before_compute(self) -> None:
        if "raise" in self.modes:
            raise InjectedFault(
                f"fault injected into stage {self.label!r} of iteration {self.iteration}"
            )
        stalls = [mode.removeprefix("stall") for mode in self.modes if mode.startswith("stall")]
        if stalls:  # short sleeps: a timeout raised here lands between them
            stall_until = time.monotonic() + max(float(s or STALL_SECONDS) for s in stalls)
            while time.monotonic() < stall_until:
                time.sleep(0.05)

    def in_rank_compute(self, storage: RunStorage, rank: int) -> None:
        """Have this rank SIGKILL itself in its first backward pass, if asked (and it did
        not fire before in this run)."""
        fault = f"kill-rank{rank}"
        if fault not in self.modes:
            return
        if storage.read_rendezvous_note(self.iteration, self.label, FAULT_NOTES, fault) is not None:
            return
        record = {"pid": os.getpid()}
        storage.write_rendezvous_note(self.iteration, self.label, FAULT_NOTES, fault, record)

        def die(*_: Any) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        torch.nn.modules.module.register_module_full_backward_hook(die)

    def after_compute(self) -> None:
        if "kill" in self.modes:
            kill_process_tree()

    def after_commit(self, storage: RunStorage, refs: Mapping[str, ObjectRef]) -> list[str]:
        """Damage the committed outputs if asked (the keys damaged; none once repaired)."""
        if "damage" not in self.modes:
            return []
        return damage_once(storage, self.iteration, refs)


def damage_once(storage: RunStorage, iteration: int, refs: Mapping[str, ObjectRef]) -> list[str]:
    """Overwrite each output with one byte flipped, size unchanged, behind the manifest's
    back (what a bad disk or a partial overwrite does); the re-executed stage is spared: its
    repair is on the manifest, which a stage on another work pool reads as well."""
    if storage.read_manifest(iteration).repaired_keys() & {ref.key for ref in refs.values()}:
        return []
    for ref in refs.values():
        data = bytearray(storage.objects.get_optional(ref.key) or b"")
        data[len(data) // 2] ^= 0xFF
        storage.objects.put(ref.key, bytes(data))
    return sorted(ref.key for ref in refs.values())


def kill_process_tree() -> None:
    """SIGKILL this process and everything it started (forked reward workers), as a lost
    machine takes them along: a surviving child would hold the worker's pipe to this
    process open, and Prefect would see the crash only when that child exits. A placed
    stage declared lost ends itself this way too (``flows/placement.py``)."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    os.kill(os.getpid(), signal.SIGKILL)
