"""NeMo RL's data package: ``from nemo_rl.data import DataConfig`` (its ``data:`` section)
works here by that path, imported on first use."""

from nemo_rl_core.utils.lazy_exports import lazy_exports

__getattr__ = lazy_exports(__name__, {"DataConfig": ".config"})
