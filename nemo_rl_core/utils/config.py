"""Load NeMo RL-style YAML configs: ``defaults:`` inheritance, ``${...}`` interpolation,
``key=value`` overrides, then validation into pydantic models with errors that name the key.

NeMo RL users bring their YAML; the same file works here, and a typo fails before any
work is done instead of being silently ignored.
"""

from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


class ConfigError(ValueError):
    """A config file, key or value that cannot be used; the message names it."""


def _load_yaml_with_defaults(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError(f"config 'defaults' form a cycle: {chain}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    parents = data.pop("defaults", None)
    if parents is None:
        return data
    parent_list = [parents] if isinstance(parents, str) else parents
    if not isinstance(parent_list, list) or not all(isinstance(p, str) for p in parent_list):
        raise ConfigError(f"{path}: 'defaults' must be a file name or a list of file names")
    merged = OmegaConf.create({})
    for parent in parent_list:
        parent_data = _load_yaml_with_defaults(path.parent / parent, (*seen, path))
        merged = OmegaConf.merge(merged, OmegaConf.create(parent_data))
    merged = OmegaConf.merge(merged, OmegaConf.create(data))
    return OmegaConf.to_container(merged, resolve=False)


def load_config(config_path: str | Path) -> dict[str, Any]:
    """Read a YAML config, merging the files its ``defaults:`` names (unresolved)."""
    return _load_yaml_with_defaults(Path(config_path))


def parse_hydra_overrides(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML), then resolve ``${...}``."""
    merged = OmegaConf.create(config)
    for override in overrides:
        key, sep, raw = override.lstrip("+").partition("=")
        if not sep or not key:
            raise ConfigError(f"override {override!r} must look like key.path=value")
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError as err:
            raise ConfigError(f"override {override!r}: value is not valid YAML: {err}") from err
        OmegaConf.update(merged, key, value, merge=True, force_add=True)
    try:
        return OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"config interpolation failed: {err}") from err


def load_config_with_overrides(config_path: str | Path, overrides: list[str] | None = None) -> dict:
    """The resolved config dict: file, its defaults, then ``overrides``."""
    return parse_hydra_overrides(load_config(config_path), list(overrides or []))


def validate_config(model: type[ModelT], data: dict[str, Any], source: str = "config") -> ModelT:
    """Validate ``data`` into ``model``; every problem is reported with its dotted key path."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            key = ".".join(str(part) for part in error["loc"]) or "<root>"
            if error["type"] == "extra_forbidden":
                problems.append(f"  {key}: unknown key (check the spelling against NeMo RL's)")
            else:
                shown = repr(error.get("input"))[:80]
                problems.append(f"  {key}: {error['msg']} (got {shown})")
        raise ConfigError(f"invalid {source}:\n" + "\n".join(problems)) from None
