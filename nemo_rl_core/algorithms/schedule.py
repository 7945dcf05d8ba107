"""When an algorithm validates, how many steps it trains, how far ahead its rollouts run:
NeMo RL's schedule keys (``val_period``, ``max_num_steps``, ...), which every algorithm's
section carries, read the same way for all of them.
"""

from typing import Any, Protocol


class ValidationSchedule(Protocol):
    """NeMo RL's validation keys, which ``grpo:``, ``ppo:`` and ``sft:`` all carry."""

    val_period: int
    val_at_start: bool
    val_at_end: bool


def validation_due(loop: ValidationSchedule, step: int, final_step: int) -> bool:
    """Whether the weights after ``step`` updates are validated (NeMo RL's schedule:
    ``val_at_start`` for step 0, every ``val_period`` steps, ``val_at_end`` for the weights
    after the run's ``final_step``)."""
    if step == 0:
        return loop.val_at_start
    periodic = loop.val_period > 0 and step % loop.val_period == 0
    return periodic or (loop.val_at_end and step == final_step)


def validates(loop: ValidationSchedule) -> bool:
    return loop.val_period > 0 or loop.val_at_start or loop.val_at_end


class StepLimits(Protocol):
    """NeMo RL's run-length keys, which every training algorithm's section carries."""

    max_num_epochs: int
    max_num_steps: int


def planned_steps(loop: StepLimits, batches_per_epoch: int) -> int:
    """Training steps of the whole run: ``max_num_steps``, or fewer when ``max_num_epochs``
    passes over the data end first (as NeMo RL's loop stops at whichever comes first);
    ``max_num_steps: -1`` (NeMo RL's reward-model default) sets no step limit."""
    epochs = loop.max_num_epochs * batches_per_epoch
    return epochs if loop.max_num_steps == -1 else min(loop.max_num_steps, epochs)


def async_depth(loop: Any) -> int:
    """How many steps ahead rollouts run (``max_trajectory_age_steps``); 0 when synchronous."""
    settings = getattr(loop, "async_grpo", None)
    return settings.max_trajectory_age_steps if settings and settings.enabled else 0
