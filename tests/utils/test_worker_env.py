"""A model's ``env_vars`` (NeMo RL's worker environment) set in this process and put back."""

import os

import pytest

from nemo_rl_core.utils.worker_env import WorkerEnvironment


def test_env_vars_are_set_over_the_environment_and_put_back(monkeypatch):
    monkeypatch.setenv("NEMO_RL_CORE_TEST_KEPT", "before")
    monkeypatch.delenv("NEMO_RL_CORE_TEST_NEW", raising=False)
    environment = WorkerEnvironment()
    environment.apply({"NEMO_RL_CORE_TEST_KEPT": "1", "NEMO_RL_CORE_TEST_NEW": "2"}, "policy.x")
    environment.apply({"NEMO_RL_CORE_TEST_NEW": "2"}, "value.x")  # the same value: fine
    assert os.environ["NEMO_RL_CORE_TEST_KEPT"] == "1"  # the section's value wins, as in NeMo RL
    assert os.environ["NEMO_RL_CORE_TEST_NEW"] == "2"
    environment.restore()
    assert os.environ["NEMO_RL_CORE_TEST_KEPT"] == "before"
    assert "NEMO_RL_CORE_TEST_NEW" not in os.environ


def test_two_models_asking_one_variable_for_different_values_are_refused(monkeypatch):
    monkeypatch.delenv("NEMO_RL_CORE_TEST_NEW", raising=False)
    environment = WorkerEnvironment()
    environment.apply({"NEMO_RL_CORE_TEST_NEW": "a"}, "policy.dtensor_cfg.env_vars")
    with pytest.raises(ValueError, match=r"value.dtensor_cfg.env_vars.NEMO_RL_CORE_TEST_NEW='b'"):
        environment.apply({"NEMO_RL_CORE_TEST_NEW": "b"}, "value.dtensor_cfg.env_vars")
    environment.restore()
