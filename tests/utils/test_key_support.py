"""The key-rule machinery: refusals name the dotted key, value and reason; every declared
key is visible to the coverage walk, and every key of a master config carries a rule."""

from typing import Annotated, ClassVar

import pytest
from pydantic import BaseModel

from nemo_rl_core.pipeline.algorithm_configs import ALGORITHM_CONFIGS
from nemo_rl_core.utils.key_support import (
    Check,
    Machine,
    Only,
    PartOf,
    ReadWhile,
    SupportContext,
    UnsupportedConfigError,
    Wired,
    check_support,
    declared_keys,
    gpu_memory_knob,
    read_while_enabled,
    resolve_reader,
)


class Inner(BaseModel):
    enabled: Annotated[bool, Only(False, reason="not built")] = False
    size: Annotated[int, PartOf("outer.inner.enabled")] = 3


def _gpus_fit(value: int, context: SupportContext) -> str | None:
    """A rule that reads the machine, as the cluster's GPU counts do."""
    if value <= max(context.machine.cuda_devices, 1):
        return None
    return (
        f"tensor parallelism needs {value} GPUs, this machine has {context.machine.gpus_phrase()}"
    )


class Outer(BaseModel):
    lr: Annotated[float, Wired("nemo_rl_core.utils.key_support:check_support")] = 1.0
    tp: Annotated[int, Check(_gpus_fit, "as many GPUs as it asks for")] = 1
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


class Switched(BaseModel):
    read_while: ClassVar[ReadWhile] = ReadWhile(read_while_enabled)

    enabled: Annotated[bool, Only(False, True, reason="unused")] = False
    size: Annotated[int, Only(1, reason="size 1 only")] = 1


class Beside(BaseModel):
    read_while: ClassVar[ReadWhile] = ReadWhile(
        lambda section, context: context.sibling_value("backend") == "vllm",
        still_read=("precision",),
    )

    precision: Annotated[str, Only("float32", reason="float32 only")] = "float32"
    shards: Annotated[int, Only(1, reason="one shard")] = 1


class Sections(BaseModel):
    backend: str = "hf"
    switched: Switched = Switched()
    engine: Beside = Beside()


def test_a_section_not_read_checks_only_the_keys_still_read():
    """NeMo RL does not read a section that is off: its other keys' rules do not apply."""
    unread = Sections(switched=Switched(size=2), engine=Beside(shards=2, precision="fp8"))
    with pytest.raises(UnsupportedConfigError) as err:
        check_support(unread, Machine(cuda_devices=0))
    assert [refusal.key for refusal in err.value.refusals] == ["engine.precision"]
    read = Sections(
        backend="vllm", switched=Switched(enabled=True, size=2), engine=Beside(shards=2)
    )
    with pytest.raises(UnsupportedConfigError) as err:
        check_support(read, Machine(cuda_devices=0))
    assert [refusal.key for refusal in err.value.refusals] == ["switched.size", "engine.shards"]


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


def test_a_rule_reads_keys_of_its_own_models_section():
    class Model(BaseModel):
        backend: str = "hf"
        packing: Annotated[
            bool,
            Check(
                lambda value, context: f"{context.key} on {context.section_value('backend')}",
                "names its model's backend",
            ),
        ] = True

    class Master(BaseModel):
        policy: Model = Model()
        value: Model = Model(backend="megatron")

    with pytest.raises(UnsupportedConfigError) as err:
        check_support(Master(), Machine(cuda_devices=0))
    assert "policy.packing=True: policy.packing on hf" in str(err.value)
    assert "value.packing=True: value.packing on megatron" in str(err.value)


def test_gpu_memory_knob_is_moot_without_cuda_and_refused_with_it():
    class Knobs(BaseModel):
        offload: Annotated[bool, gpu_memory_knob(False, "offloading")] = True

    check_support(Knobs(), Machine(cuda_devices=0))
    check_support(Knobs(offload=False), Machine(cuda_devices=1))
    with pytest.raises(UnsupportedConfigError, match="offload=True: offloading is not built"):
        check_support(Knobs(), Machine(cuda_devices=1))


# Every declared algorithm's config (a new algorithm's keys are held to a rule unasked).
MASTER_CONFIGS = [declared.config_class for declared in ALGORITHM_CONFIGS.values()]


@pytest.mark.parametrize("master", MASTER_CONFIGS, ids=lambda m: m.__name__)
def test_every_key_of_a_master_config_carries_one_rule(master: type[BaseModel]):
    """A key with no rule would be accepted and ignored. (Two rules on one key raise here.)"""
    leaves = [k for k in declared_keys(master) if not k.section]
    unruled = sorted(k.key for k in leaves if k.rule is None)
    assert unruled == [], f"keys with no rule: {unruled}"


@pytest.mark.parametrize("master", MASTER_CONFIGS, ids=lambda m: m.__name__)
def test_every_wired_reader_and_tuned_feature_exists(master: type[BaseModel]):
    keys = list(declared_keys(master))
    declared = {k.key for k in keys}
    for key in keys:
        if isinstance(key.rule, Wired):
            assert callable(resolve_reader(key.rule.by)), f"{key.key}: {key.rule.by}"
        if isinstance(key.rule, PartOf):
            own_section = f"{key.key.partition('.')[0]}.{key.rule.feature}"
            assert {key.rule.feature, own_section} & declared, f"{key.key}: {key.rule.feature}"
