"""Hold a run's storage lease for the life of a flow run.

The lease has a short time-to-live and a background thread renews it, so two flow runs
of one experiment never drive it at once, and a run that was killed (no renewals) stops
blocking the next one within ``NEMO_RL_CORE_LEASE_TTL_S`` seconds. The renewal thread
logs to the flow run's own log (it is handed the run's logger), and a renewal that finds
the lease taken stops the run before its next commit (``RunStorage`` refuses it).
"""

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.lease import Lease, LeaseLostError
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
    log = stage_logger()  # bound to this flow run: the thread has no run context of its own

    def keep_renewed() -> None:
        while not stop.wait(ttl / 3):
            try:
                lease.renew()
            except LeaseLostError as err:
                log.error("run %s: %s", run.run_id, err)
                return
            except Exception as err:  # noqa: BLE001 - a failed renewal must not kill the run here
                log.warning("run %s: lease renewal failed: %s", run.run_id, err)

    renewer = threading.Thread(target=keep_renewed, name=f"lease-{run.run_id}", daemon=True)
    renewer.start()
    try:
        yield lease
    except BaseException:
        # The run's own failure is what its final state must name; a failed release (the
        # store being down is often why the run failed) is logged beside it, never instead.
        stop.set()
        renewer.join()
        try:
            lease.release()
        except Exception as err:  # noqa: BLE001
            log.warning("run %s: releasing the lease failed too: %s", run.run_id, err)
        raise
    stop.set()
    renewer.join()
    lease.release()
