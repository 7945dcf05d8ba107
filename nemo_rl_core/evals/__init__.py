"""Evaluation of a checkpoint on a dataset with answers (NeMo RL's ``nemo_rl.evals``)."""
