"""NeMo RL's core API (v0.7 era), re-implemented for staged, restartable training.

Module paths mirror ``nemo_rl``: ``nemo_rl.X`` is ``nemo_rl_core.X``. This package never
imports Prefect; orchestration lives in the top-level ``tasks`` and ``flows`` packages.
"""

__version__ = "0.1.0"
