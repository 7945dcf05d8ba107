"""Hold a run's storage lease for the life of a flow run.

The lease has a short time-to-live and a background thread renews it, so two flow runs
of one experiment never drive it at once, and a run that was killed (no renewals) stops
blocking the next one within ``NEMO_RL_CORE_LEASE_TTL_S`` seconds.
"""

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.run_storage import Lease
from tasks.stage import stage_logger

DEFAULT_TTL_S = 120.0


def lease_ttl_s() -> float:
    return float(os.environ.get("NEMO_RL_CORE_LEASE_TTL_S", DEFAULT_TTL_S))


@contextmanager
def hold_lease(run: RunRef, owner: str) -> Iterator[Lease]:
    """Take the lease (``LeaseHeldError`` if another live run has it) and keep it renewed."""
    ttl = lease_ttl_s()
    lease = open_storage(run).acquire_lease(owner=owner, ttl_s=ttl)
    stop = threading.Event()

    def keep_renewed() -> None:
        while not stop.wait(ttl / 3):
            try:
                lease.renew()
            except Exception as err:  # noqa: BLE001 - a failed renewal must not kill the run here
                stage_logger().warning("run %s: lease renewal failed: %s", run.run_id, err)

    renewer = threading.Thread(target=keep_renewed, name=f"lease-{run.run_id}", daemon=True)
    renewer.start()
    try:
        yield lease
    finally:
        stop.set()
        renewer.join()
        lease.release()
