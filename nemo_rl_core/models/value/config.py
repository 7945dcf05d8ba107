"""The value model's config section: the policy's training keys, nothing generation-related.

A PPO critic is trained like the policy (same optimizer, scheduler, batching and
precision keys), so a ``value:`` section reads like a ``policy:`` one.
"""

from nemo_rl_core.models.policy.config import TrainedModelConfig


class ValueConfig(TrainedModelConfig):
    """``value:``: ``model_name`` is the policy's model (or checkpoint) to start the backbone
    from, or a separate model directory; a saved value checkpoint restores its head too."""
