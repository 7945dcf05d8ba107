"""The config loader reads NeMo RL's YAML and command lines as NeMo RL does."""

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from nemo_rl_core.utils.config import (
    ConfigError,
    OverridesError,
    load_config,
    load_config_with_overrides,
    parse_hydra_overrides,
    register_omegaconf_resolvers,
)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_child_values_win_and_reach_parent_interpolations(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", "size: 2\nmodel: {width: 8, depth: 2}\ntotal: ${mul:${size},4}\n")
    child = write(tmp_path, "child.yaml", "defaults: base.yaml\nsize: 5\nmodel: {depth: 3}\n")
    config = load_config(child)
    assert isinstance(config, DictConfig)
    assert "defaults" not in config
    assert config.model.width == 8 and config.model.depth == 3
    assert config.total == 20


def test_later_parents_win_and_parents_resolve_their_own_defaults(tmp_path: Path) -> None:
    write(tmp_path, "shared/root.yaml", "a: root\nb: root\nc: root\n")
    write(tmp_path, "shared/middle.yaml", "defaults: root.yaml\nb: middle\n")
    write(tmp_path, "other.yaml", "c: other\n")
    child = write(tmp_path, "child.yaml", "defaults: [shared/middle.yaml, other.yaml]\n")
    assert OmegaConf.to_container(load_config(child)) == {"a": "root", "b": "middle", "c": "other"}


def test_absolute_parent_path(tmp_path: Path) -> None:
    parent = write(tmp_path, "elsewhere/parent.yaml", "x: 1\n")
    child = write(tmp_path, "dir/child.yaml", f"defaults: {parent}\ny: 2\n")
    assert OmegaConf.to_container(load_config(child)) == {"x": 1, "y": 2}


def test_override_marker_replaces_a_section_instead_of_merging(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", "optimizer: {name: adam, lr: 1.0, betas: [0.9, 0.99]}\n")
    child = write(
        tmp_path, "child.yaml", "defaults: base.yaml\noptimizer: {_override_: true, name: sgd}\n"
    )
    assert OmegaConf.to_container(load_config(child).optimizer) == {"name": "sgd"}


def test_numbers_read_as_omegaconf_reads_them(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "eps: 1e-8\nlr: 5.0e-6\nsteps: 10\n")
    config = load_config_with_overrides(path, ["lr=5e-4"])
    assert config == {"eps": 1e-8, "lr": 5e-4, "steps": 10}
    assert all(isinstance(config[k], float) for k in ("eps", "lr"))


def test_resolvers_mul_div_max() -> None:
    register_omegaconf_resolvers()
    register_omegaconf_resolvers()  # twice is harmless
    cfg = OmegaConf.create(
        {"a": 6, "b": 4, "m": "${mul:${a},${b}}", "d": "${div:${a},${b}}", "x": "${max:${a},${b}}"}
    )
    assert (cfg.m, cfg.d, cfg.x) == (24, 1.5, 6)


def test_hydra_override_grammar() -> None:
    cfg = OmegaConf.create({"model": {"kind": "llama", "width": 8}, "train": {"batch": 4}})
    parse_hydra_overrides(
        cfg, ["model.width=16", "+model.depth=2", "++model.kind=qwen", "~train.batch"]
    )
    assert OmegaConf.to_container(cfg) == {
        "model": {"kind": "qwen", "width": 16, "depth": 2},
        "train": {},
    }
    parse_hydra_overrides(cfg, ["model.kind=[a,b]", "model.width=null"])
    assert cfg.model.kind == ["a", "b"] and cfg.model.width is None


@pytest.mark.parametrize(
    ("override", "named"),
    [("model.depht=3", "model.depht"), ("model.width", "model.width"), ("~missing.key", "missing")],
)
def test_refused_overrides_name_the_key(override: str, named: str) -> None:
    cfg = OmegaConf.create({"model": {"width": 8}})
    with pytest.raises(OverridesError) as err:
        parse_hydra_overrides(cfg, [override])
    assert named in str(err.value)
    assert isinstance(err.value, ConfigError)
    assert cfg.model.width == 8


def test_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found: .*missing.yaml"):
        load_config(tmp_path / "missing.yaml")
    bad = write(tmp_path, "bad.yaml", "a: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_config(bad)
    listing = write(tmp_path, "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(listing)
    loop = write(tmp_path, "loop.yaml", "defaults: loop2.yaml\n")
    write(tmp_path, "loop2.yaml", "defaults: loop.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(loop)


def test_unresolvable_interpolation_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "a: ${nowhere.key}\n")
    with pytest.raises(ConfigError, match="interpolation"):
        load_config_with_overrides(path)
