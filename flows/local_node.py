"""The one node of a warm rank group on this machine's ranks (``cluster.gpus_per_node > 1``,
one node, the training stage not placed on a pool): the flow's own process launches its
torchrun (``launch_node``) in a background thread that holds the launch for the group's
life, where a pool's group has a node task run on a stage worker (``flows.placed_nodes``).

Its state reads as a node task run's does: ``Running`` while the launch holds, then
``Completed`` (the group was stopped) or ``Failed`` (how the launch ended is also noted on
the run's storage by ``launch_node``: ``RendezvousNotes.end``). The ranks reach the flow's
Prefect API (the server it talks to, or its ephemeral one) to serve their orders. The launch
thread is the ranks' launcher: should the flow's process die, its kernel ends them
(``nemo_rl_core.distributed.launcher_death``).
"""

import threading

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State
from prefect.states import Completed, Failed, Running

from nemo_rl_core.distributed.node_launch import Rendezvous, RendezvousNotes, launch_node


class LocalNode:
    """Node 0 of ``rendezvous`` (its only node) running ``program``, launched now from this
    process; sets ``ended`` once its launch returned or raised."""

    def __init__(
        self,
        program: list[str],
        rendezvous: Rendezvous,
        notes: RendezvousNotes,
        ended: threading.Event,
    ) -> None:
        with get_client(sync_client=True) as client:
            # a server's, or the ephemeral one's this process runs; as PREFECT_API_URL is
            # written (no trailing slash: the task worker's subscription URL appends to it)
            api_url = str(client.api_url).rstrip("/")
        self.final: State | None = None
        self.ended = ended
        self.thread = threading.Thread(
            target=self.launch,
            args=(program, rendezvous, notes, {"PREFECT_API_URL": api_url}),
            name=f"rank-group-{rendezvous.attempt}",
            daemon=True,
        )
        self.thread.start()

    def launch(
        self,
        program: list[str],
        rendezvous: Rendezvous,
        notes: RendezvousNotes,
        env: dict[str, str],
    ) -> None:
        try:
            launch_node(program, 0, rendezvous, notes, env=env)
            self.final = Completed(message="its rank group was stopped")
        except Exception as err:  # noted on storage by launch_node; said by the flow
            self.final = Failed(message=str(err))
        finally:
            self.ended.set()

    def state(self, check: bool) -> State:
        """Its launch's state now (``check`` is for a node task run's reads of the server)."""
        return self.final if self.final is not None else Running()
