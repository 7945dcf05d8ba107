"""Megatron in one process sets up its one-rank group without touching the environment."""

import os

import pytest

RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_one_rank_twice_leaves_no_rendezvous_variables_for_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In this process (a subprocess cost seconds of torch and megatron-core imports): the
    environment it checks is what this process's children inherit."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from nemo_rl_core.models.megatron.model import init_parallel_state

    def end_group() -> None:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()

    for key in RENDEZVOUS_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    end_group()  # a model an earlier test of this process built
    try:
        init_parallel_state(1, 0)
        end_group()
        init_parallel_state(1, 0)  # a second model after the first one's group was ended
        assert [key for key in RENDEZVOUS_VARIABLES if key in os.environ] == []
    finally:
        end_group()
