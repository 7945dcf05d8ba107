"""Environment registry (``nemo_rl.environments.utils``): ``create_env(name, config)`` builds
an environment from its ``env.<name>`` section; ``register_env`` adds a user's own.

Classes are imported on first use, so asking for the math environment does not load the
reward model's transformers stack, and checking a config's ``env:`` loads no environment
(a built-in one's section validates into its model in ``environments.config``).
"""

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from pydantic import BaseModel

if TYPE_CHECKING:
    from nemo_rl_core.environments.interfaces import EnvironmentInterface

_ENVS = "nemo_rl_core.environments"


class EnvRegistryEntry(TypedDict, total=False):
    actor_class_fqn: str
    config_class_fqn: NotRequired[str]  # its section's model, when not the class's own
    default_processor: NotRequired[str]


def _builtin(actor: str, config: str) -> EnvRegistryEntry:
    return {"actor_class_fqn": f"{_ENVS}.{actor}", "config_class_fqn": f"{_ENVS}.config.{config}"}


# name -> the environment class's fully qualified name (NeMo RL's names, and our games).
ENV_REGISTRY: dict[str, EnvRegistryEntry] = {
    "math_default": _builtin("math_environment.MathEnvironment", "MathEnvConfig"),
    "math": _builtin("math_environment.MathEnvironment", "MathEnvConfig"),
    "math_multi_reward": _builtin(
        "math_environment.MathMultiRewardEnvironment", "MathMultiRewardEnvConfig"
    ),
    "countdown": _builtin("math_environment.CountdownEnvironment", "MathEnvConfig"),
    "code": _builtin("code_environment.CodeEnvironment", "CodeEnvConfig"),
    "reward_model": _builtin(
        "reward_model_environment.RewardModelEnvironment", "RewardModelEnvConfig"
    ),
    "sliding_puzzle_game": _builtin(
        "games.sliding_puzzle.SlidingPuzzleEnv", "SlidingPuzzleEnvConfig"
    ),
    "sliding_puzzle": _builtin("games.sliding_puzzle.SlidingPuzzleEnv", "SlidingPuzzleEnvConfig"),
}


class UnknownEnvironmentError(KeyError):
    """An environment name that is not registered."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def register_env(env_name: str, actor_class_fqn: str) -> None:
    """Register the class ``actor_class_fqn`` (``package.module.Class``) as ``env_name``."""
    if env_name in ENV_REGISTRY:
        raise ValueError(f"Env name {env_name} already registered")
    ENV_REGISTRY[env_name] = {"actor_class_fqn": actor_class_fqn}


def get_object(fqn: str) -> Any:
    """The object a fully qualified name (``package.module.Name``) names."""
    module_name, _, name = fqn.rpartition(".")
    if not module_name:
        raise ValueError(f"{fqn!r} is not a fully qualified name (package.module.Class)")
    return getattr(importlib.import_module(module_name), name)


def registry_entry(env_name: str) -> EnvRegistryEntry:
    if env_name not in ENV_REGISTRY:
        raise UnknownEnvironmentError(
            f"unknown environment {env_name!r}; known environments: "
            f"{', '.join(sorted(ENV_REGISTRY))} (register_env() adds your own)"
        )
    return ENV_REGISTRY[env_name]


def environment_class(env_name: str) -> "Callable[[Any], EnvironmentInterface]":
    """The registered class; every one is built from its config section (``create_env``)."""
    return get_object(registry_entry(env_name)["actor_class_fqn"])


def _settings(env_config: Any) -> Any:
    """NeMo RL nests the sliding puzzle's settings under ``cfg``; both forms are taken."""
    config = env_config if env_config is not None else {}
    if isinstance(config, dict) and set(config) == {"cfg"}:
        return config["cfg"]
    return config


def check_env_config(env_name: str, env_config: Any) -> None:
    """Refuse an unknown environment or a wrong key of its section, naming
    ``env.<name>.<key>``, without building the environment."""
    env_section(env_name, env_config)


def env_section(env_name: str, env_config: Any) -> tuple[str, BaseModel] | None:
    """The section's path below ``env.`` and its validated model (None: the environment
    declares no config class); an unknown environment or a wrong key is refused."""
    from nemo_rl_core.config.base import validate_section

    entry = registry_entry(env_name)
    if "config_class_fqn" in entry:
        config_class = get_object(entry["config_class_fqn"])
    else:  # a registered environment of the user's: its class says
        config_class = getattr(environment_class(env_name), "config_class", None)
    settings = _settings(env_config)
    if config_class is None or not isinstance(settings, dict):
        return None
    path = env_name + (".cfg" if settings is not env_config else "")
    return path, validate_section(config_class, settings, f"env.{path}")


# NeMo RL v0.7's environments that are not built here (its ENV_REGISTRY, and the names its
# vision-language and audio recipes score with): a config naming one loads, and the env
# key's rule refuses it before any work, with why.
_MULTIMODAL = "a vision or audio environment, and this project trains text-only models"
NOT_BUILT_ENVIRONMENTS = {
    "code_jaccard": "NeMo RL's Jaccard-similarity code environment is not built here",
    "nemo_gym": "NeMo Gym's environments are not built here",
    **dict.fromkeys(("vlm", "clevr-cogent", "geometry3k", "mmpr-tiny", "mmau"), _MULTIMODAL),
}


ENVIRONMENTS_BUILT = (
    "each section builds its registered environment (create_env); one of an environment "
    "not built here is refused"
)


def environments_not_built(env: Mapping[str, Any], context: Any = None) -> str | None:
    """Why ``env:`` cannot run here (the ``env`` key's rule, checked before any work): a
    section of an environment that is not built, or not registered; None when all are."""
    unknown = sorted(name for name in env if not is_registered_env(name))
    if not unknown:
        return None
    if unknown[0] in NOT_BUILT_ENVIRONMENTS:
        return f"{unknown[0]!r}: {NOT_BUILT_ENVIRONMENTS[unknown[0]]}"
    return (
        f"no environment {unknown[0]!r} is built here (NeMo RL ignores a section that no "
        "dataset names; remove it, or register_env() yours)"
    )


def is_registered_env(env_name: str) -> bool:
    return env_name in ENV_REGISTRY


def registered_env_section(env_name: str, env_config: Any) -> tuple[str, BaseModel] | None:
    """:func:`env_section` of a registered environment; None for a section of an unknown
    one, which validation lets through only where no dataset names it (never read)."""
    return env_section(env_name, env_config) if is_registered_env(env_name) else None


def create_env(env_name: str, env_config: Any = None) -> "EnvironmentInterface":
    """Build the environment ``env_name`` from its config section (a dict or its model)."""
    return environment_class(env_name)(_settings(env_config))
