"""NeMo RL's ``nemo_rl.distributed.virtual_cluster`` path of the ``cluster:`` section, which
lives in the config package (:mod:`nemo_rl_core.config.cluster`)."""

from nemo_rl_core.config.cluster import ClusterConfig

__all__ = ["ClusterConfig"]
