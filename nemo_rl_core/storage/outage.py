"""One time budget for a store that cannot be reached, and a log line on every failed try.

Without it an outage was silent for minutes and cost the product of four retry layers
(botocore's attempts x s3fs's retries x read timeouts x Prefect's task retries). Here the
clients fail fast (:data:`S3_FAST_FAIL`), each storage call retries itself with backoff
until ``NEMO_RL_CORE_STORAGE_BUDGET_S`` seconds have passed (default 180), logging each
failure on the ``nemo_rl_core.storage`` logger (the flows forward it to the run's Prefect
log), and then raises :class:`StorageUnreachableError`, which nothing retries again.
"""

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_BUDGET_S = 180.0
BUDGET_ENV = "NEMO_RL_CORE_STORAGE_BUDGET_S"
MAX_BACKOFF_S = 10.0
# botocore options (and s3fs's own retry count, S3_TRIES, set on the file system): a stopped
# or unreachable endpoint fails one try in seconds, and the retrying happens once, here,
# where it is logged and bounded.
S3_TRIES = 1
S3_FAST_FAIL = {
    "config_kwargs": {
        "connect_timeout": 5,
        "read_timeout": 15,
        "retries": {"max_attempts": 1, "mode": "standard"},
    },
}

# Answers, not outages: an absent object, a refused permission, a name already taken.
PERMANENT = (
    FileNotFoundError,
    PermissionError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
)

log = logging.getLogger("nemo_rl_core.storage")


class StorageError(RuntimeError):
    """Storage unreachable or an operation on it failed; names the URL. Retrying may help."""


class StorageUnreachableError(StorageError):
    """The store stayed unreachable for the whole budget; retrying again would only wait."""


def storage_budget_s() -> float:
    return float(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET_S))


def retry_within_budget(
    operation: Callable[[], T],
    what: str,
    transient: tuple[type[BaseException], ...],
    budget_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``operation()``, retried on ``transient`` errors with backoff (1, 2, 4 ... 10 s) until
    ``budget_s`` has passed; each failure is logged with the time left."""
    budget = storage_budget_s() if budget_s is None else budget_s
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return operation()
        except transient as exc:
            if isinstance(exc, PERMANENT):
                raise
            attempt += 1
            elapsed = time.monotonic() - started
            if elapsed >= budget:
                raise StorageUnreachableError(
                    f"{what}: storage unreachable for {elapsed:.0f} s over {attempt} tries "
                    f"(budget {budget:.0f} s, {BUDGET_ENV}); last error: {exc}"
                ) from exc
            delay = min(2.0 ** (attempt - 1), MAX_BACKOFF_S, budget - elapsed)
            log.warning(
                "%s failed (try %d, %.0f s of the %.0f s budget used): %s; retrying in %.0f s",
                what,
                attempt,
                elapsed,
                budget,
                exc,
                delay,
            )
            sleep(delay)
