"""The HF backend's model over several ranks, as NeMo RL's DTensor worker lays it out.

Inside a torch.distributed world of W ranks (the training stage's ranks, started by
torchrun), ``dtensor_cfg.tensor_parallel_size`` T makes the mesh ``(dp = W / T, tp = T)``:
tensor parallelism first (``custom_parallel_plan`` if given, else the plan transformers
ships with the model class, ``_tp_plan``), then FSDP2 ``fully_shard`` of every decoder
layer and of the root over the ``dp`` mesh (HSDP with ``dtensor_cfg.dp_replicate_size`` R:
``dp`` split into ``dp_replicate = R x dp_shard``; ``dtensor_cfg.sequence_parallel`` keeps
the activations between the TP regions split along the sequence). Each data-parallel rank trains on its slice of
the global batch with the loss normalised by the *global* valid counts, so its loss is a
share of the one-process loss; FSDP's gradient reduction averages over the ``dp`` ranks,
so each rank back-propagates ``dp`` times its share (as NeMo RL does) and the reduced
gradient is the one-process gradient.

On CPU the collectives run on gloo: FSDP2's all-gather and reduce-scatter and DTensor's
tensor-parallel all-reduces all work there (``tests/distributed``). What gloo lacks is
NCCL's pre-multiplied sum (``PREMUL_SUM``: FSDP's custom gradient divide factors fail
with it, hence the scaled loss instead) and speed: no overlap of communication with
compute, every collective through host memory and TCP.
"""

import importlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from transformers import PreTrainedModel

_TP_KEY = "dtensor_cfg.tensor_parallel_size"
_REPLICATE_KEY = "dtensor_cfg.dp_replicate_size"
_SP_KEY = "dtensor_cfg.sequence_parallel"

# transformers' names in a model class's ``_tp_plan`` -> the torch parallel style. The LM
# head gathers its output: the losses read plain full-vocabulary logits.
_HF_STYLES: dict[str, Any] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
}
# The same names with sequence parallelism: between the tensor-parallel regions the
# activations stay split along the sequence (DTensors sharded on dim 1, so the model's code
# still sees the whole sequence's shape): a row-parallel projection reduce-scatters into
# that layout, and the LM head all-gathers the sequence before its column split.
_SP_STYLES: dict[str, Any] = {
    "colwise": ColwiseParallel,
    "rowwise": lambda: RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    "embedding_rowwise": lambda: RowwiseParallel(
        input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
    ),
    "colwise_gather_output": lambda: ColwiseParallel(
        input_layouts=Shard(1), output_layouts=Replicate()
    ),
    "colwise_rep": lambda: ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
}
# What each decoder layer (and the decoder) must have for it: NeMo RL's Llama/Qwen2 layout.
_SP_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")


@dataclass(frozen=True)
class Sharding:
    """Where this rank sits: its data-parallel index among ``dp_size`` (it trains on that
    slice of each global batch) and the tensor-parallel size ``tp_size``."""

    mesh: DeviceMesh
    dp_rank: int
    dp_size: int
    tp_size: int

    @property
    def dp_group(self) -> dist.ProcessGroup:
        return self.mesh.get_group("dp")


def shard_model(
    model: PreTrainedModel,
    tp_size: int,
    custom_plan: str | None,
    device: torch.device,
    replicate: int = 1,
    sequence_parallel: bool = False,
) -> Sharding:
    """Apply TP (when ``tp_size`` > 1), then FSDP2, in place; where this rank sits. With
    ``replicate`` R > 1 (``dtensor_cfg.dp_replicate_size``) FSDP2 runs as HSDP over a
    ``(dp_replicate = R, dp_shard = dp / R)`` mesh: each shard group holds one copy of the
    weights, and the R copies all-reduce their gradients; the data-parallel ranks that split
    each batch are still all ``dp`` of them (the two dims flattened). ``sequence_parallel``
    keeps the activations between the tensor-parallel regions split along the sequence."""
    world = dist.get_world_size()
    if world % tp_size:
        raise ValueError(
            f"{_TP_KEY}={tp_size} must divide the training world size {world} "
            "(cluster.num_nodes x cluster.gpus_per_node)"
        )
    dp = world // tp_size
    if dp % replicate:
        raise ValueError(
            f"{_REPLICATE_KEY}={replicate} must divide the data-parallel size {dp} "
            f"(training world size {world} / {_TP_KEY} {tp_size})"
        )
    if replicate == 1:
        mesh = init_device_mesh(device.type, (dp, tp_size), mesh_dim_names=("dp", "tp"))
        fsdp_mesh = mesh["dp"]
    else:
        mesh = init_device_mesh(
            device.type,
            (replicate, dp // replicate, tp_size),
            mesh_dim_names=("dp_replicate", "dp_shard", "tp"),
        )
        fsdp_mesh = mesh["dp_replicate", "dp_shard"]  # 2-D: FSDP2's HSDP
        fsdp_mesh._flatten("dp")  # the data-parallel group: ``mesh["dp"]``
    if tp_size > 1:
        _check_heads(model, tp_size)
        tied = _tied_embeddings(model)
        plan = tensor_parallel_plan(model, custom_plan, sequence_parallel)
        parallelize_module(model, mesh["tp"], plan)
        if tied:  # the plan replaced both parameters; share one again, as before
            head: Any = model.get_output_embeddings()
            head.weight = model.get_input_embeddings().weight
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=fsdp_mesh)
    fully_shard(model, mesh=fsdp_mesh, reshard_after_forward=False)
    return Sharding(mesh, mesh["dp"].get_local_rank(), mesh["dp"].size(), tp_size)


def decoder_layers(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The repeated blocks FSDP shards one by one (each all-gathered only while it runs)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        base = getattr(model, getattr(model, "base_model_prefix", ""), None)
        layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__} has no decoder layers to shard (get_decoder().layers); "
            "train it in one process (cluster.num_nodes=1, cluster.gpus_per_node<=1)"
        )
    return list(layers)


def tensor_parallel_plan(
    model: PreTrainedModel, custom_plan: str | None, sequence_parallel: bool = False
) -> dict[str, Any]:
    """``{module pattern: ParallelStyle}``: ``custom_parallel_plan`` (a dotted path to such a
    dict, or to a function returning one, as in NeMo RL), else the model class's own; with
    ``sequence_parallel``, the model class's own in its sequence-parallel form."""
    if custom_plan is not None and sequence_parallel:
        raise ValueError(
            f"{_SP_KEY} with dtensor_cfg.custom_parallel_plan={custom_plan!r}: a custom plan's "
            "own styles lay out the activations; set sequence_parallel false and give "
            "SequenceParallel styles in the plan"
        )
    if custom_plan is not None:
        module_name, _, attribute = custom_plan.rpartition(".")
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(
                f"dtensor_cfg.custom_parallel_plan={custom_plan!r}: cannot import it ({err}); "
                "name a dict of module pattern -> ParallelStyle, or a function returning one"
            ) from err
        plan = found() if callable(found) else found
        if not isinstance(plan, dict) or not all(
            isinstance(style, ParallelStyle) for style in plan.values()
        ):
            raise ValueError(
                f"dtensor_cfg.custom_parallel_plan={custom_plan!r} is not a dict of module "
                "pattern -> torch.distributed.tensor.parallel.ParallelStyle"
            )
        return plan
    hf_plan: dict[str, str] = dict(getattr(model, "_tp_plan", None) or {})
    if not hf_plan:
        raise ValueError(
            f"{_TP_KEY}: {type(model).__name__} ships no tensor-parallel plan (_tp_plan); "
            "give one with dtensor_cfg.custom_parallel_plan or set it to 1"
        )
    styles = _SP_STYLES if sequence_parallel else _HF_STYLES
    unknown = sorted({style for style in hf_plan.values() if style not in styles})
    if unknown:
        raise ValueError(
            f"{_TP_KEY}: {type(model).__name__}'s plan uses styles {unknown}, not built here "
            f"(known: {sorted(styles)}); give dtensor_cfg.custom_parallel_plan instead"
        )
    plan = {pattern: styles[style]() for pattern, style in hf_plan.items()}
    if sequence_parallel:
        plan.update(_sequence_parallel_regions(model))
    return plan


def _sequence_parallel_regions(model: PreTrainedModel) -> dict[str, ParallelStyle]:
    """What sequence parallelism adds to the model's TP plan: the embedding's output and
    every norm split along the sequence, each attention and MLP block gathering the whole
    sequence at its input, and the output head gathering it too (the LM head before its
    column split, another head, a value model's, before it runs whole)."""
    names = {id(module): name for name, module in model.named_modules()}
    decoder, layers = model.get_decoder(), decoder_layers(model)
    missing = [part for part in _SP_LAYER_PARTS if not hasattr(layers[0], part)]
    if not hasattr(decoder, "norm"):
        missing.append("a final norm")
    if missing:
        raise ValueError(
            f"{_SP_KEY}: built for decoder layers of {list(_SP_LAYER_PARTS)} and a final norm "
            f"(Llama, Qwen2), and {type(model).__name__} lacks {missing}; set it false"
        )
    split = SequenceParallel(use_local_output=False)
    gathered = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    regions: dict[str, ParallelStyle] = {
        names[id(model.get_input_embeddings())]: _SP_STYLES["embedding_rowwise"](),
        names[id(decoder.norm)]: split,
    }
    for layer in layers:
        prefix = names[id(layer)]
        regions[f"{prefix}.input_layernorm"] = split
        regions[f"{prefix}.post_attention_layernorm"] = split
        regions[f"{prefix}.self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
        )
        regions[f"{prefix}.mlp"] = gathered
    head = model.get_output_embeddings()
    if head is not None:
        regions[names[id(head)]] = _SP_STYLES["colwise_gather_output"]()
    whole = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
    )
    for name, child in model.named_children():
        if isinstance(child, torch.nn.Linear) and child is not head:  # a value model's score
            regions[name] = whole
    return regions


def _check_heads(model: PreTrainedModel, tp_size: int) -> None:
    config = model.config
    for name in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, name, None)
        if heads is not None and heads % tp_size:
            raise ValueError(f"{_TP_KEY}={tp_size} must divide the model's {name}={heads}")


def _tied_embeddings(model: PreTrainedModel) -> bool:
    head = model.get_output_embeddings()
    return head is not None and head.weight is model.get_input_embeddings().weight


# ---- the step's gradients ---------------------------------------------------------------


def grad_norm(params: list[torch.nn.Parameter]) -> float:
    """The global L2 norm of the gradients, one all-reduce: each rank adds the squares of its
    local shard, a value replicated over r ranks counted 1/r times on each."""
    world = dist.get_world_size()
    local = torch.zeros((), dtype=torch.float64)
    for param in params:
        grad = param.grad
        if grad is None:
            continue
        copies = world
        if isinstance(grad, DTensor):
            copies = world // grad.device_mesh.size()  # ranks outside its mesh hold copies
            for dim, placement in enumerate(grad.placements):
                if placement.is_replicate():
                    copies *= grad.device_mesh.size(dim)
            grad = grad.to_local()
        local += grad.detach().double().pow(2).sum().cpu() / copies
    total = local.to(_collective_device())
    dist.all_reduce(total)
    return float(total.sqrt())


def scale_grads(params: list[torch.nn.Parameter], factor: float) -> None:
    """Multiply every local gradient shard by ``factor`` (clipping by the global norm)."""
    for param in params:
        if param.grad is not None:
            grad = param.grad
            (grad.to_local() if isinstance(grad, DTensor) else grad).mul_(factor)


def _collective_device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else (torch.device("cpu"))
    )


# ---- checkpoints: full tensors on rank 0 ------------------------------------------------

_FULL_ON_WRITER = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights, on rank 0's CPU (empty elsewhere); every rank must call it.
    A parameter shared under two names (tied embeddings) is kept under its first name
    only, as ``save_pretrained`` of the unsharded model writes it."""
    state: dict[str, Any] = get_model_state_dict(model, options=_FULL_ON_WRITER)
    first_names = {name for name, _ in model.named_parameters()}
    aliases = {name for name, _ in model.named_parameters(remove_duplicate=False)} - first_names
    return {name: tensor for name, tensor in state.items() if name not in aliases}


def full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """The optimizer's unsharded state on rank 0 (empty elsewhere), in the one-process
    layout (``optimizer.state_dict()``: parameters numbered in order), so a checkpoint
    resumes at any world size; every rank must call it."""
    by_name: Any = get_optimizer_state_dict(model, optimizer, options=_FULL_ON_WRITER)
    if not by_name:
        return {}
    index = {name: i for i, name in enumerate(trainable_names(model))}
    return {
        "state": {index[name]: state for name, state in by_name["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in by_name["param_groups"]
        ],
    }


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, numbered: dict[str, Any]
) -> None:
    """Load a one-process ``optimizer.state_dict()`` into the sharded optimizer, each rank
    keeping its shard; every rank must call it with the same state."""
    names = trainable_names(model)
    by_name: Any = {
        "state": {names[i]: state for i, state in numbered["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]}
            for group in numbered["param_groups"]
        ],
    }
    set_optimizer_state_dict(
        model, optimizer, by_name, options=StateDictOptions(full_state_dict=True)
    )


def trainable_names(model: torch.nn.Module) -> list[str]:
    """Names of the trained parameters in the order the optimizer holds them."""
    return [name for name, param in model.named_parameters() if param.requires_grad]
