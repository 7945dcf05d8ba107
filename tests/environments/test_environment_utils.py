"""``register_env``: a user's environment class joins the registry under a new name only."""

import pytest

from nemo_rl_core.environments.math_environment import MathEnvironment
from nemo_rl_core.environments.utils import (
    ENV_REGISTRY,
    UnknownEnvironmentError,
    create_env,
    environment_class,
    get_object,
    register_env,
)


@pytest.fixture
def registry():
    saved = dict(ENV_REGISTRY)
    yield ENV_REGISTRY
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


class EchoEnvironment:
    """Stands for a user's environment: created from its config section."""

    def __init__(self, config):
        self.config = config


def test_registered_environment_is_created_by_name(registry):
    register_env("echo", f"{__name__}.EchoEnvironment")
    assert registry["echo"] == {"actor_class_fqn": f"{__name__}.EchoEnvironment"}
    env = create_env("echo", {"answer": 42})
    assert isinstance(env, EchoEnvironment) and env.config == {"answer": 42}


def test_a_taken_name_is_refused_and_keeps_its_class(registry):
    with pytest.raises(ValueError, match="Env name math already registered"):
        register_env("math", f"{__name__}.EchoEnvironment")
    assert registry["math"]["actor_class_fqn"].endswith(MathEnvironment.__name__)
    with pytest.raises(UnknownEnvironmentError, match="'nope'.*register_env"):
        create_env("nope")


@pytest.mark.parametrize("name", sorted(ENV_REGISTRY))
def test_a_built_in_section_validates_into_its_environment_s_own_config(name: str) -> None:
    """The config check validates ``env.<name>`` by the registry's config class, without
    importing the environment: it must be the class the environment itself builds from."""
    entry = ENV_REGISTRY[name]
    assert get_object(entry["config_class_fqn"]) is environment_class(name).config_class
