"""A stage worker's subscription outlives a busy server: a connection closed, refused, or
whose handshake timed out is made again, and the next task run still arrives."""

import asyncio

import pytest
import websockets
from prefect.client.schemas.objects import TaskRun

from flows.stage_worker import RunAtATimeSubscription

SCHEDULED = TaskRun(task_key="stage@pool", dynamic_key="0")


class OneMessage:
    async def recv(self) -> str:
        return SCHEDULED.model_dump_json()


@pytest.mark.parametrize(
    "failure",
    [
        TimeoutError("timed out during opening handshake"),
        ConnectionRefusedError(),
        websockets.exceptions.ConnectionClosedError(None, None),
    ],
)
def test_a_failed_connection_is_made_again(
    failure: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    subscription = RunAtATimeSubscription(
        TaskRun, "/task_runs/subscriptions/scheduled", keys=["k"], base_url="http://server/api"
    )
    attempts: list[int] = []

    async def connect() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise failure
        subscription._websocket = OneMessage()  # type: ignore[assignment]

    monkeypatch.setattr(subscription, "_ensure_connected", connect)
    assert asyncio.run(subscription.__anext__()).id == SCHEDULED.id
    assert len(attempts) == 2
