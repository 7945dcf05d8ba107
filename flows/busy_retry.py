"""Soon-retried task-run submissions: a Prefect server on SQLite (the ephemeral API of the
embedded default, ``prefect server start`` without PostgreSQL) answers a creation that lost
a write race with 503, and Prefect's client then waits 2 s before it tries again.

The race is the server's: it creates a task run in a deferred transaction that reads before
it inserts, so any commit in between (the task-run recorder writes a batch every second, a
worker a state) fails the insert at once with "database is locked" (SQLite's busy timeout
covers only transactions that start as writers). Task-run submissions (``Task.apply_async``:
placed stages, shards, rank-group orders and nodes) lost ~2 s in about half of the
iterations of a warm rank group this way (bench/RESULTS.md, issue 30). Answered 503, the
submission is retried after ``SOON_S`` instead, then Prefect's own back-off takes over: a
server that is really unavailable is not hammered. The creation is an upsert on the task
run's flow run, task key and dynamic key, so a retry never makes two.
"""

import weakref

import httpx
from prefect.client.orchestration import PrefectClient

# The delays after the first 503s of one request; after the 4th and 5th, Prefect's own (16,
# 32 s). Consecutive 503s made a wait of 2 + 4 + 8 + ... s before.
SOON_S = (0.05, 0.2, 0.5)
_answered: "weakref.WeakKeyDictionary[httpx.Request, int]" = weakref.WeakKeyDictionary()


async def retry_soon(response: httpx.Response) -> None:
    """An httpx response hook: a 503 without ``Retry-After`` gets the next of ``SOON_S``,
    which Prefect's client waits before it sends the request again."""
    if response.status_code != httpx.codes.SERVICE_UNAVAILABLE:
        return
    if "Retry-After" in response.headers:
        return
    count = _answered.get(response.request, 0)
    _answered[response.request] = count + 1
    if count < len(SOON_S):
        response.headers["Retry-After"] = str(SOON_S[count])


def retrying_soon(client: PrefectClient) -> PrefectClient:
    """``client``, its busy answers retried soon (``retry_soon``). Prefect's clients take
    httpx settings only as they are made, and one made with them is not shared through
    Prefect's client context; the hook goes onto its httpx client instead."""
    http = client._client  # noqa: SLF001 - Prefect's httpx client; its hooks are httpx's API
    http.event_hooks = {**http.event_hooks, "response": [*http.event_hooks["response"], retry_soon]}
    return client
