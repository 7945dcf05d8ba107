"""How a policy driven from the flow's process refits its generation engine: with a state
dict or a checkpoint, never over a collective group shared with the engine's workers."""

from typing import Any

SINGLE_PROCESS_REFIT = (
    "this policy has no collective group with the generation engine; refit it with "
    "policy.state_dict_for_refit() -> generation.update_weights_from_state_dict(), or "
    "policy.save_checkpoint(dir) -> generation.update_weights_from_checkpoint(dir)"
)


class StateDictRefit:
    """``ColocatablePolicyInterface``'s collective refit calls, refused with the way to
    refit instead (the HF and Megatron policies)."""

    def init_collective(
        self, ip: str, port: int, world_size: int, *, train_world_size: int
    ) -> list[Any]:
        raise NotImplementedError(SINGLE_PROCESS_REFIT)

    def stream_weights_via_ipc_zmq(self, *args: Any, **kwargs: Any) -> list[Any]:
        raise NotImplementedError(SINGLE_PROCESS_REFIT)

    def broadcast_weights_for_collective(
        self, kv_scales: dict[str, float] | None = None
    ) -> list[Any]:
        raise NotImplementedError(SINGLE_PROCESS_REFIT)
