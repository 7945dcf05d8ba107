"""The key-rule machinery: refusals name the dotted key, value and reason; every declared
key is visible to the coverage walk."""

from typing import Annotated

import pytest
from pydantic import BaseModel

from nemo_rl_core.utils.key_support import (
    Machine,
    Only,
    PartOf,
    UnsupportedConfigError,
    Wired,
    check_support,
    declared_keys,
    needs_gpus,
    resolve_reader,
)


class Inner(BaseModel):
    enabled: Annotated[bool, Only(False, reason="not built")] = False
    size: Annotated[int, PartOf("outer.inner.enabled")] = 3


class Outer(BaseModel):
    lr: Annotated[float, Wired("nemo_rl_core.utils.key_support:check_support")] = 1.0
    tp: Annotated[int, needs_gpus(lambda v: v, "tensor parallelism")] = 1
    inner: Inner = Inner()
    named: dict[str, Inner] = {}


def test_supported_config_passes():
    check_support(Outer(), Machine(cuda_devices=0))


def test_every_refusal_is_named_with_its_path_value_and_reason():
    config = Outer(tp=4, inner=Inner(enabled=True), named={"a": Inner(enabled=True)})
    with pytest.raises(UnsupportedConfigError) as err:
        check_support(config, Machine(cuda_devices=0), source="config x.yaml")
    text = str(err.value)
    assert "config x.yaml" in text
    assert "tp=4: tensor parallelism needs 4 GPUs, this machine has none" in text
    assert "inner.enabled=True: not built" in text
    assert "named.a.enabled=True: not built" in text


def test_gpu_rule_passes_when_the_devices_exist():
    check_support(Outer(tp=4), Machine(cuda_devices=4))


def test_only_distinguishes_bool_from_int():
    class M(BaseModel):
        x: Annotated[int | bool, Only(0, reason="zero only")] = 0

    with pytest.raises(UnsupportedConfigError):
        check_support(M(x=False), Machine(cuda_devices=0))


def test_declared_keys_walk_sections_and_mappings():
    keys = {k.key: k for k in declared_keys(Outer)}
    assert set(keys) == {
        "lr",
        "tp",
        "inner",
        "inner.enabled",
        "inner.size",
        "named",
        "named.*.enabled",
        "named.*.size",
    }
    assert keys["inner"].section and not keys["lr"].section
    assert isinstance(keys["named.*.size"].rule, PartOf)


def test_wired_reader_resolves():
    assert resolve_reader("nemo_rl_core.utils.key_support:check_support") is check_support
