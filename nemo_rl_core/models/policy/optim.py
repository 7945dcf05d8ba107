"""Optimizer and LR schedule from the ``policy.optimizer`` / ``policy.scheduler`` sections."""

from collections.abc import Iterable

import torch

from nemo_rl_core.models.policy.config import (
    OptimizerConfig,
    SchedulerConfig,
    SchedulerEntry,
    SchedulerMilestones,
)
from nemo_rl_core.models.policy.utils import import_class_from_path

LRScheduler = torch.optim.lr_scheduler.LRScheduler


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimizerConfig
) -> torch.optim.Optimizer:
    """The optimizer class named in the config; ``betas`` lists become tuples as torch wants."""
    kwargs = dict(config.kwargs)
    if isinstance(kwargs.get("betas"), list):
        kwargs["betas"] = tuple(kwargs["betas"])
    return import_class_from_path(config.name)(params, **kwargs)


def _constant(_step: int) -> float:
    return 1.0


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    config: list[SchedulerEntry] | SchedulerConfig | None,
) -> LRScheduler:
    """NeMo RL's forms: none (constant LR), one scheduler, or a list run by ``SequentialLR``."""
    if config is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=_constant)
    if isinstance(config, SchedulerConfig):
        return import_class_from_path(config.name)(optimizer, **config.kwargs)
    schedulers = [
        import_class_from_path(entry.name)(optimizer, **entry.kwargs)
        for entry in config
        if isinstance(entry, SchedulerConfig)
    ]
    if len(schedulers) == 1:
        return schedulers[0]
    milestones = next(e.milestones for e in config if isinstance(e, SchedulerMilestones))
    return torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers, milestones)
