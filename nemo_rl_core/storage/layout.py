"""The keys of a run's objects, relative to ``<root>/runs/<run_id>/`` (the layout drawn in
``run_storage``): iterations, stage outputs, part entries, stage-run records, checkpoints."""

import re

from nemo_rl_core.storage.names import validate_name

ITER_RE = re.compile(r"^iter_(\d+)$")
STEP_RE = re.compile(r"^step_(\d+)$")
STAGING_PREFIX = ".staging-"
COMMITTED = "COMMITTED"
TRAINING_INFO = "training_info.json"
MANIFEST = "MANIFEST.json"
STAGE_RUNS = "stage_runs"  # heartbeats of stages running in other processes
PART_SUFFIX = ".entry.json"  # a part's own entry, beside its outputs


def iter_dir(iteration: int) -> str:
    return f"iter_{non_negative('iteration', iteration):06d}"


def step_dir(step: int) -> str:
    return f"checkpoints/step_{non_negative('step', step):06d}"


def stage_key(iteration: int, stage: str, filename: str) -> str:
    return f"{iter_dir(iteration)}/{validate_name('stage', stage)}/{filename}"


def manifest_key(iteration: int) -> str:
    return f"{iter_dir(iteration)}/{MANIFEST}"


def non_negative(kind: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{kind} must be a non-negative int, got {value!r}")
    return value


def numbered(names: list[str], pattern: re.Pattern[str]) -> list[int]:
    return [int(m.group(1)) for name in names if (m := pattern.fullmatch(name))]
