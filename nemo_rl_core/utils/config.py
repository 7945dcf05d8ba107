"""Load NeMo RL configs the way NeMo RL does: OmegaConf YAML with ``defaults:`` inheritance
(``_override_`` replaces a section), its ``mul``/``div``/``max`` resolvers, Hydra's override
grammar (``a.b=v``, ``+new=v``, ``++any=v``, ``~gone``) on a struct config, then validation
into pydantic models with errors that name the dotted key.

NeMo RL users bring their YAML and their command lines; both work unchanged here, numbers
are read as OmegaConf reads them (``1e-8`` is a float), and a typo fails before any work.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)
T = TypeVar("T")

_OVERRIDE_MARKER = "_override_"


class ConfigError(ValueError):
    """A config file, key or value that cannot be used; the message names it."""


class OverridesError(ConfigError):
    """A command-line override that Hydra's grammar or the config's keys refuse."""


def register_omegaconf_resolvers() -> None:
    """Register NeMo RL's arithmetic resolvers (``${mul:a,b}``, ``${div:a,b}``, ``${max:a,b}``)."""
    resolvers: dict[str, Callable[..., Any]] = {
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "max": max,
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def resolve_path(base_path: Path, path: str) -> Path:
    """``path`` as written in a ``defaults:`` list: absolute, or relative to ``base_path``."""
    return Path(path) if path.startswith("/") else base_path / path


def merge_with_override(base_config: DictConfig, override_config: DictConfig) -> DictConfig:
    """Merge ``override_config`` over ``base_config``; a top-level section marked
    ``_override_: true`` replaces the base's section instead of merging into it."""
    for key in list(override_config.keys()):
        section = override_config[key]
        if isinstance(section, DictConfig) and section.get(_OVERRIDE_MARKER, False):
            section.pop(_OVERRIDE_MARKER)
            if key in base_config:
                base_config.pop(key)
    return cast(DictConfig, OmegaConf.merge(base_config, override_config))


def _read_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        config = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ConfigError(f"config file {path} is not valid YAML: {_one_line(err)}") from None
    if not isinstance(config, DictConfig):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return config


def _defaults_list(config: DictConfig, path: Path) -> list[str]:
    defaults = config.pop("defaults")
    if isinstance(defaults, str):
        return [defaults]
    if isinstance(defaults, ListConfig) and all(isinstance(d, str) for d in defaults):
        return [str(d) for d in defaults]
    raise ConfigError(f"{path}: 'defaults' must be a file name or a list of file names")


def load_config_with_inheritance(
    config_path: str | Path,
    base_dir: str | Path | None = None,
    _chain: tuple[Path, ...] = (),
) -> DictConfig:
    """Read ``config_path`` and merge it over the files its ``defaults:`` names, depth-first,
    later parents winning; a parent's own ``defaults:`` resolve from its directory."""
    path = Path(config_path)
    if path.resolve() in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, path.resolve()))
        raise ConfigError(f"config 'defaults' form a cycle: {cycle}")
    base = Path(base_dir) if base_dir is not None else path.parent
    config = _read_yaml(path)
    if "defaults" not in config:
        return config
    merged = OmegaConf.create({})
    for parent in _defaults_list(config, path):
        parent_path = resolve_path(base, parent)
        parent_config = load_config_with_inheritance(
            parent_path, parent_path.parent, (*_chain, path.resolve())
        )
        merged = merge_with_override(merged, parent_config)
    return merge_with_override(merged, config)


def load_config(config_path: str | Path) -> DictConfig:
    """The config at ``config_path`` with its ``defaults:`` merged, interpolations unresolved
    (a child's value reaches every ``${...}`` that names it)."""
    register_omegaconf_resolvers()
    return load_config_with_inheritance(config_path)


def _one_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    kept = [line for line in lines if not line.startswith(("full_key:", "object_type=", "Key '"))]
    return "; ".join(kept or lines) or type(err).__name__


def parse_hydra_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """Apply Hydra overrides to ``cfg`` in place (struct mode: a key that is not in the config
    needs ``+``, ``++`` sets whether or not it exists, ``~key`` deletes); returns ``cfg``."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OmegaConf.set_struct(cfg, True)
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
        ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
    except Exception as err:  # Hydra raises its own and OmegaConf's exception types
        raise OverridesError(f"override refused: {_one_line(err)}") from err
    return cfg


def resolve_config(cfg: DictConfig) -> dict[str, Any]:
    """The plain dict of ``cfg`` with every ``${...}`` resolved."""
    register_omegaconf_resolvers()
    try:
        return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as err:
        raise ConfigError(f"config interpolation failed: {_one_line(err)}") from None


def load_config_with_overrides(
    config_path: str | Path, overrides: list[str] | None = None
) -> dict[str, Any]:
    """The resolved config dict: the file, its defaults, then the Hydra ``overrides``."""
    config = load_config(config_path)
    if overrides:
        config = parse_hydra_overrides(config, list(overrides))
    return resolve_config(config)


def validate_config(model: type[ModelT], data: dict[str, Any], source: str = "config") -> ModelT:
    """Validate ``data`` into ``model``; the error is one line: the first problem with its
    dotted key path and value, then the keys of any others (a value written once often
    fails again where ``${...}`` copies it). A check across sections names its own keys."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = err.errors()
        keys = [".".join(str(part) for part in error["loc"]) for error in errors]
        first, key = errors[0], keys[0]
        if first["type"] == "extra_forbidden":
            problem = f"{key}: unknown key (check the spelling against NeMo RL's)"
        elif not key:
            problem = first["msg"]
        else:
            problem = f"{key}: {first['msg']} (got {repr(first.get('input'))[:80]})"
        others = [k or "<config>" for k in keys[1:]]
        also = f" (also wrong: {', '.join(others)})" if others else ""
        raise ConfigError(f"invalid {source}: {problem}{also}") from None


def load_config_file(
    config_path: str, overrides: list[str] | None, config_class: type[ModelT]
) -> ModelT:
    """Load, override and validate a YAML into ``config_class``; errors name the file or
    the key path. Relative input files of its ``data:`` section are made absolute from the
    config file's directory (``with_files_from``), so a run started elsewhere finds them."""
    source = f"config {config_path}"
    config = validate_config(
        config_class, load_config_with_overrides(config_path, overrides), source
    )
    data = cast(Any, config).data
    return config.model_copy(
        update={"data": data.with_files_from(Path(config_path).resolve().parent)}
    )


def filled(value: T | None, key: str) -> T:
    """A nullable key that validation (or a backend's setup) fills in or requires by now.

    Code past that point reads it through here, so the type says it is set; None means the
    config skipped that step, which is a bug, not a user error.
    """
    if value is None:
        raise RuntimeError(f"{key} is null where validation should have set or refused it")
    return value
