"""What a run's storage holds of its progress, and what its records say it should hold.

Every iteration's committing stage (``train``) commits the checkpoint the next iteration
starts from before its manifest entry is written, and retention never deletes the newest
checkpoint, so in an intact run the newest committed checkpoint is at least the step the
manifests record as committed. One that is older (or missing) means stored progress was
lost: a wiped store, deleted folders; the caller decides what to do about it.
"""

from dataclasses import dataclass

from nemo_rl_core.storage.checkpoint_store import CheckpointStore
from nemo_rl_core.storage.layout import manifest_key
from nemo_rl_core.storage.manifest_store import ManifestStore
from nemo_rl_core.storage.object_store import ObjectStore


@dataclass(frozen=True)
class StoredProgress:
    """A run's stored progress: its config, iteration folders and committed checkpoints,
    and the step its manifests record as committed last (0: none) with the manifest that
    records it."""

    has_config: bool
    iterations: list[int]
    committed: list[int]
    recorded_step: int
    recorded_in: str | None

    @property
    def newest_checkpoint(self) -> int:
        return self.committed[-1] if self.committed else 0

    @property
    def lost_steps(self) -> bool:
        """Whether the manifests record a newer checkpoint than the newest that is there."""
        return self.recorded_step > self.newest_checkpoint

    @property
    def empty(self) -> bool:
        """No iteration and no checkpoint stored (a config may be)."""
        return not self.iterations and not self.committed

    def missing_iterations(self) -> list[int]:
        """Iterations before the newest checkpoint that have no folder (their manifests,
        batches and rollouts are gone; the checkpoint still holds what continuing needs)."""
        return sorted(set(range(self.newest_checkpoint)) - set(self.iterations))


def stored_progress(
    objects: ObjectStore,
    manifests: ManifestStore,
    checkpoints: CheckpointStore,
    committing_stage: str,
) -> StoredProgress:
    """The run's stored progress; the manifests are read from the newest iteration down
    until one records ``committing_stage`` complete (one or two reads in a healthy run)."""
    iterations = manifests.iterations()
    recorded_step, recorded_in = 0, None
    for iteration in reversed(iterations):
        if manifests.read_manifest(iteration).complete(committing_stage) is not None:
            recorded_step = iteration + 1
            recorded_in = objects.url(manifest_key(iteration))
            break
    return StoredProgress(
        has_config=objects.exists("config.yaml"),
        iterations=iterations,
        committed=checkpoints.committed_checkpoints(),
        recorded_step=recorded_step,
        recorded_in=recorded_in,
    )
