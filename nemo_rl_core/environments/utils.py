"""Environment registry: ``create_env(name, config)`` builds an environment from its
``env.<name>`` config section, with NeMo RL's names.

Classes are imported on first use, so asking for the math environment does not load the
reward model's transformers stack.
"""

import importlib
from typing import Any

from nemo_rl_core.environments.interfaces import EnvironmentInterface

# name -> "module:Class"; aliases are the names NeMo RL's YAML files use.
ENV_REGISTRY: dict[str, str] = {
    "math": "nemo_rl_core.environments.math_environment:MathEnvironment",
    "countdown": "nemo_rl_core.environments.math_environment:CountdownEnvironment",
    "sliding_puzzle_game": "nemo_rl_core.environments.games.sliding_puzzle:SlidingPuzzleEnv",
    "sliding_puzzle": "nemo_rl_core.environments.games.sliding_puzzle:SlidingPuzzleEnv",
    "code": "nemo_rl_core.environments.code_environment:CodeEnvironment",
    "reward_model": "nemo_rl_core.environments.reward_model_environment:RewardModelEnvironment",
}


class UnknownEnvironmentError(KeyError):
    """An environment name that is not registered."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def register_env(name: str, target: str) -> None:
    """Register ``target`` ("module:Class") under ``name`` (a user's own environment)."""
    if ":" not in target:
        raise ValueError(f"env target must be 'module:Class', got {target!r}")
    ENV_REGISTRY[name] = target


def create_env(env_name: str, env_config: Any = None) -> EnvironmentInterface:
    """Build the environment ``env_name`` from its config section (a dict or its pydantic model).

    The sliding puzzle's section nests its settings under ``cfg`` as in NeMo RL's YAML
    (``env.sliding_puzzle_game.cfg.max_moves``); both that and the bare settings are accepted.
    """
    if env_name not in ENV_REGISTRY:
        raise UnknownEnvironmentError(
            f"unknown environment {env_name!r}; known environments: {', '.join(sorted(ENV_REGISTRY))}"
        )
    module_name, class_name = ENV_REGISTRY[env_name].split(":")
    env_class = getattr(importlib.import_module(module_name), class_name)
    config = env_config if env_config is not None else {}
    if isinstance(config, dict) and set(config) == {"cfg"}:
        config = config["cfg"]
    return env_class(config)
