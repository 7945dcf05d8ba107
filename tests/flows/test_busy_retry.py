"""A busy server's 503 is retried soon by Prefect's own client (its ``Retry-After``
handling), then with Prefect's back-off."""

import asyncio
import time

import httpx
from prefect.client.orchestration import PrefectClient

from flows.busy_retry import SOON_S, retry_soon, retrying_soon


def answered(status: int, request: httpx.Request, **headers: str) -> httpx.Response:
    response = httpx.Response(status, request=request, headers=headers)
    asyncio.run(retry_soon(response))
    return response


def test_the_first_busy_answers_of_a_request_ask_for_a_soon_retry_then_prefects_own() -> None:
    request = httpx.Request("POST", "http://server/api/task_runs/")
    delays = [answered(503, request).headers.get("Retry-After") for _ in range(len(SOON_S) + 1)]
    assert delays == [*(str(s) for s in SOON_S), None]
    other = httpx.Request("POST", "http://server/api/task_runs/")
    assert answered(503, other).headers["Retry-After"] == str(SOON_S[0]), "counted per request"


def test_other_answers_and_a_servers_own_retry_after_are_left_alone() -> None:
    request = httpx.Request("POST", "http://server/api/task_runs/")
    assert "Retry-After" not in answered(201, request).headers
    assert "Retry-After" not in answered(500, request).headers
    assert answered(503, request, **{"Retry-After": "7"}).headers["Retry-After"] == "7"


def test_a_prefect_client_retries_a_busy_answer_within_a_fraction_of_a_second() -> None:
    calls: list[float] = []

    def server(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if len(calls) == 1:
            return httpx.Response(503, json={"exception_message": "Service Unavailable"})
        return httpx.Response(200, json="👋")

    transport = httpx.MockTransport(server)
    client = retrying_soon(
        PrefectClient("http://server/api", httpx_settings={"transport": transport})
    )
    assert asyncio.run(client.hello()).json() == "👋"
    assert len(calls) == 2
    assert calls[1] - calls[0] < 1.0, "Prefect's own first retry waits 2 s"
