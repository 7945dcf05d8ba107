"""``checkpointing:`` keys: what a staged run cannot do is refused before any work."""

import pytest
from policy_testing import NO_GPU, support_refusals

from nemo_rl_core.utils.checkpoint import CheckpointingConfig


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (["checkpointing.model_save_format=torch_save"], "torch_save (DCP) is not written"),
    ],
)
def test_checkpointing_keys_a_staged_run_cannot_honour_are_refused(
    overrides: list[str], refused: str
) -> None:
    assert refused in support_refusals("grpo_math_tiny.yaml", overrides, NO_GPU)


def test_checkpointing_disabled_runs_and_its_other_keys_are_not_read() -> None:
    """NeMo RL reads no key of a disabled checkpointing section; the run keeps only the
    newest checkpoint (tests/flows/test_checkpointing_disabled_flow.py)."""
    overrides = ["checkpointing.enabled=false", "checkpointing.model_save_format=torch_save"]
    assert support_refusals("grpo_math_tiny.yaml", overrides, NO_GPU) == ""


def test_sharded_or_consolidated_both_run() -> None:
    overrides = ["checkpointing.save_consolidated=false"]
    assert support_refusals("grpo_math_tiny.yaml", overrides, NO_GPU) == ""


def test_deadline_must_read_as_days_hours_minutes_seconds() -> None:
    assert CheckpointingConfig(checkpoint_must_save_by="00:03:45:00")
    with pytest.raises(ValueError, match="not DD:HH:MM:SS"):
        CheckpointingConfig(checkpoint_must_save_by="3h45")
