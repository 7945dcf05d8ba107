"""Datasets of the ``data:`` section; ``AllTaskProcessedDataset`` at NeMo RL's path (loaded
on first use: it needs torch, the config check does not)."""

from nemo_rl_core.utils.lazy_exports import lazy_exports

__getattr__ = lazy_exports(__name__, {"AllTaskProcessedDataset": ".processed_dataset"})
