"""Fixtures of the policy tests."""

import pytest
from policy_testing import token_batch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


@pytest.fixture
def batch() -> BatchedDataDict:
    return token_batch()
