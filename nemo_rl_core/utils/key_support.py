"""What every config key does on this deployment: read by the code, or refused with a reason.

A NeMo RL YAML carries a few hundred keys. Each one a config model declares carries one
rule in its type (``Annotated[int, Only(1, reason=...)]``):

- :class:`Wired` — the key is read by the code it names; every value NeMo RL allows works.
- :class:`Only` — the key works at the listed values (what this deployment does); any
  other value is refused before any work, with the key's dotted path and the reason.
- :class:`Check` — a rule that needs more than a list of values (the machine's GPUs, other
  keys of the config).
- :class:`PartOf` — the key tunes a feature that another key switches on; it matters only
  while that feature is on, and the feature's own rule decides whether it can be.

A section that NeMo RL reads only while it is in use (``megatron_cfg`` while Megatron
trains, ``vllm_cfg`` while vLLM generates, ``lora_cfg`` while LoRA is on) says so with a
:class:`ReadWhile` class attribute ``read_while``: while it is not in use, the rules of its
keys do not apply (NeMo RL would not read them), except the keys that decide whether it is.

Schema validation (pydantic) stays machine-independent, so NeMo RL's own configs validate
everywhere; :func:`check_support` is the second gate, run before a flow does anything, that
refuses what cannot run here. ``tests/utils/test_key_support.py`` holds every leaf key of
every master config to carrying exactly one rule, so a key cannot be accepted and ignored.
"""

import importlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.cpu_cores import usable_cpu_cores
from nemo_rl_core.utils.cuda_devices import visible_cuda_devices


@dataclass(frozen=True)
class Machine:
    """What this process can run on: its CUDA devices and CPU cores."""

    cuda_devices: int
    cpu_cores: int = field(default_factory=usable_cpu_cores)

    @staticmethod
    @cache
    def current() -> "Machine":
        return Machine(cuda_devices=visible_cuda_devices())

    def gpus_phrase(self) -> str:
        return "none" if self.cuda_devices == 0 else str(self.cuda_devices)


@dataclass(frozen=True)
class SupportContext:
    """What a rule may look at besides its own value: the whole config, the machine, and
    the dotted path of the key being checked (``key``)."""

    config: BaseModel
    machine: Machine
    key: str = ""

    def value(self, dotted: str) -> Any:
        """The value of another key, by its dotted path from the config's root (a list's
        entries by their index: ``data.train.0.dataset_name``)."""
        node: Any = self.config
        for part in dotted.split("."):
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list | tuple) and part.isdigit():
                node = node[int(part)] if int(part) < len(node) else None
            else:
                node = getattr(node, part, None)
        return node

    def section_value(self, dotted: str) -> Any:
        """The value of a key by its path from the top-level section holding ``key``: the
        sections the policy and the value model share read their own model's keys."""
        return self.value(f"{self.key.partition('.')[0]}.{dotted}")

    def sibling_value(self, name: str) -> Any:
        """The value of the key ``name`` beside ``key`` (in the same section)."""
        parent = self.key.rpartition(".")[0]
        return self.value(f"{parent}.{name}" if parent else name)


class KeyRule:
    """One key's semantics here. ``refusal`` returns why a value cannot run, or None."""

    def refusal(self, value: Any, context: SupportContext) -> str | None:
        return None

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Wired(KeyRule):
    """Read by ``by`` (``package.module:symbol``, checked importable by the tests)."""

    by: str

    def describe(self) -> str:
        return f"works as in NeMo RL (read by `{self.by}`)"


@dataclass(frozen=True, init=False)
class Only(KeyRule):
    """Works at ``values``; any other value is refused with ``reason``."""

    values: tuple[Any, ...]
    reason: str

    def __init__(self, *values: Any, reason: str) -> None:
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "reason", reason)

    def refusal(self, value: Any, context: SupportContext) -> str | None:
        if any(value == allowed and type(value) is type(allowed) for allowed in self.values):
            return None
        if any(value is allowed for allowed in self.values):
            return None
        return self.reason

    def describe(self) -> str:
        shown = ", ".join(repr(v) for v in self.values)
        return f"only {shown}: {self.reason}"


@dataclass(frozen=True)
class Check(KeyRule):
    """A rule computed from the value and its context; ``test`` returns a reason or None."""

    test: Callable[[Any, SupportContext], str | None]
    summary: str

    def refusal(self, value: Any, context: SupportContext) -> str | None:
        return self.test(value, context)

    def describe(self) -> str:
        return self.summary


@dataclass(frozen=True)
class PartOf(KeyRule):
    """Tunes the feature that the key ``feature`` switches on: a dotted path from the
    config's root or, in the sections the policy and the value model share, from the
    model's own section (``dtensor_cfg.tensor_parallel_size``)."""

    feature: str

    def describe(self) -> str:
        return f"tunes `{self.feature}` (matters only while it is on)"


@dataclass(frozen=True)
class ReadWhile:
    """A section's ``read_while``: NeMo RL reads the section only while ``test(section,
    context)`` holds (``context.key`` is the section's dotted path). While it does not, only
    the rules of ``still_read`` apply: the switch that turns the section on, or the keys
    another reader takes from it."""

    test: Callable[[Any, SupportContext], bool]
    still_read: tuple[str, ...] = ("enabled",)


def read_while_enabled(section: Any, context: SupportContext) -> bool:
    """The ``test`` of a section that its own ``enabled`` key switches on."""
    return bool(section.enabled)


def inert(why: str) -> Check:
    """The rule of a key whose value changes nothing here, at any value; ``why`` says so."""
    return Check(lambda value, context: None, why)


def gpu_memory_knob(off: Any, what: str) -> Check:
    """A knob that only moves or frees GPU memory, not built here: without a CUDA device
    everything already sits in host memory and every value computes the same; on a GPU
    machine any value but ``off`` is refused (it would change what fits in memory)."""

    def test(value: Any, context: SupportContext) -> str | None:
        if value == off or context.machine.cuda_devices == 0:
            return None
        return f"{what} is not built here; set it to {off!r}"

    return Check(test, f"{what}: nothing to move without CUDA; refused on a GPU machine")


@dataclass(frozen=True)
class Refusal:
    """One key that cannot run here: its dotted path, its value and why."""

    key: str
    value: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}: {self.reason}"


@dataclass
class UnsupportedConfigError(ConfigError):
    """Keys whose values this deployment cannot run; raised before any work."""

    source: str
    refusals: list[Refusal] = field(default_factory=list)

    def __str__(self) -> str:
        refused = "; ".join(str(refusal) for refusal in self.refusals)
        return f"{self.source} asks for what this deployment cannot do: {refused}"


def key_rule(annotation_metadata: list[Any]) -> KeyRule | None:
    rules = [meta for meta in annotation_metadata if isinstance(meta, KeyRule)]
    if len(rules) > 1:
        raise TypeError(f"a key carries several rules: {rules}")
    return rules[0] if rules else None


def check_support(
    config: BaseModel, machine: Machine | None = None, source: str = "config"
) -> None:
    """Raise :class:`UnsupportedConfigError` naming every key whose value cannot run here."""
    context = SupportContext(config, machine or Machine.current())
    refusals = [
        Refusal(key, value, reason)
        for key, value, rule in _rules_with_values(config, "", context)
        if (reason := rule.refusal(value, replace(context, key=key))) is not None
    ]
    if refusals:
        raise UnsupportedConfigError(source, refusals)


class TypedSections:
    """Marks a mapping of raw sections (``env:``) whose keys' rules live in a model per
    section: ``model_for(name, raw)`` gives the section's dotted path below the mapping and
    its validated model, or None where no model declares its keys."""

    def __init__(self, model_for: Callable[[str, Any], tuple[str, BaseModel] | None]) -> None:
        self.model_for = model_for


def _rules_with_values(
    model: BaseModel, prefix: str, context: SupportContext
) -> Iterator[tuple[str, Any, KeyRule]]:
    """Every key of ``model`` with its value and rule; a section not in use (its
    ``read_while``) gives only the keys that are still read."""
    read_while: ReadWhile | None = getattr(type(model), "read_while", None)
    only: tuple[str, ...] | None = None  # the keys still read of a section not in use
    if read_while is not None and not read_while.test(model, replace(context, key=prefix[:-1])):
        only = read_while.still_read
    for name, info in type(model).model_fields.items():
        key = f"{prefix}{info.alias or name}"
        if only is not None and (info.alias or name) not in only:
            continue
        value = getattr(model, name)
        rule = key_rule(info.metadata)
        if rule is not None:
            yield key, value, rule
        typed = [meta for meta in info.metadata if isinstance(meta, TypedSections)]
        if typed and isinstance(value, dict):
            for section, raw in value.items():
                if (found := typed[0].model_for(section, raw)) is not None:
                    path, section_model = found
                    yield from _rules_with_values(section_model, f"{key}.{path}.", context)
            continue
        yield from _nested(value, key, context)


def _nested(value: Any, key: str, context: SupportContext) -> Iterator[tuple[str, Any, KeyRule]]:
    if isinstance(value, BaseModel):
        yield from _rules_with_values(value, f"{key}.", context)
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _nested(item, f"{key}.{name}", context)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _nested(item, f"{key}.{index}", context)


@dataclass(frozen=True)
class DeclaredKey:
    """A key of a config class as declared: its dotted path (``*`` for a mapping's entries),
    its rule (None if it has none), and whether it is a section holding further keys."""

    key: str
    rule: KeyRule | None
    section: bool


def declared_keys(model: type[BaseModel], prefix: str = "") -> Iterator[DeclaredKey]:
    """Every key a config class declares, depth first (for the coverage test and the docs)."""
    for name, info in model.model_fields.items():
        key = f"{prefix}{info.alias or name}"
        sections = _section_models(info.annotation)
        rule = key_rule(info.metadata)
        yield DeclaredKey(key, rule, section=bool(sections))
        for section, suffix in sections:
            yield from declared_keys(section, f"{key}{suffix}.")


def _section_models(annotation: Any) -> list[tuple[type[BaseModel], str]]:
    """The config classes a field's type holds, with the path step to reach them."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _section_models(get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    if origin in (Union, types.UnionType):
        return [found for arg in get_args(annotation) for found in _section_models(arg)]
    if origin is dict:
        return [(m, f"{s}.*") for m, s in _section_models(get_args(annotation)[1])]
    if origin in (list, tuple):
        return [(m, f"{s}.*") for arg in get_args(annotation) for m, s in _section_models(arg)]
    return []


def resolve_reader(by: str) -> Any:
    """The object a :class:`Wired` rule names (``package.module:symbol.attr``)."""
    module_name, _, attr_path = by.partition(":")
    target: Any = importlib.import_module(module_name)
    for attr in filter(None, attr_path.split(".")):
        target = getattr(target, attr)
    return target
