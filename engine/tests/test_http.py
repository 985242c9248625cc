"""The HTTP surface: auth, error bodies that name the field, recovery after bad and failing calls."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from marft_engine import losses
from marft_engine.engine import Engine
from marft_engine.server import create_app, listen_socket

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    eng = Engine(device="cpu")
    with TestClient(create_app(eng, TOKEN), headers=AUTH, raise_server_exceptions=False) as c:
        r = c.post("/v1/bases", json={"name": "b", "source": "tiny:qwen2", "seed": 1, "dtype": "float32"})
        assert r.status_code == 200, r.text
        r = c.post("/v1/adapters", json={"name": "p", "base": "b"})
        assert r.status_code == 200, r.text
        yield c
    eng.close()


def good_forward(c: TestClient) -> None:
    r = c.post("/v1/forward", json={"adapter": "p", "data": [{"tokens": [1, 2, 3]}]})
    assert r.status_code == 200, r.text
    assert len(r.json()["results"][0]["logprobs"]) == 3


def test_auth_required_everywhere(client: TestClient) -> None:
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
        for method, path in (("GET", "/v1/health"), ("GET", "/v1/stats"), ("POST", "/v1/forward")):
            r = client.request(method, path, headers=headers, json={})
            assert r.status_code == 401
            assert r.json()["error"] == "unauthorized"
    r = client.get("/v1/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        (
            "/v1/forward",
            {"adapter": "nope", "data": [{"tokens": [1, 2]}]},
            404,
            "adapter: unknown adapter 'nope'",
        ),
        (
            "/v1/forward",
            {"adapter": "__base__", "base": "x", "data": [{"tokens": [1, 2]}]},
            404,
            "base: unknown base 'x'",
        ),
        ("/v1/adapters", {"name": "q", "base": "zzz"}, 404, "base: unknown base 'zzz'"),
        ("/v1/forward", {"adapter": "p", "data": [{"tokens": [1, 99999]}]}, 400, "data[0].tokens[1]"),
        (
            "/v1/forward",
            {"adapter": "p", "data": [{"tokens": [1] * 5000}]},
            400,
            "data[0].tokens: length 5000",
        ),
        ("/v1/forward", {"adapter": "p", "data": [{"tokens": [1]}]}, 422, "data[0].tokens"),
        ("/v1/forward", {"adapter": "p", "data": [], "extra": 1}, 422, "extra"),
        (
            "/v1/forward_backward",
            {
                "adapter": "p",
                "loss": "ppo",
                "data": [{"tokens": [1, 2, 3], "old_logprobs": [0, 0, 0], "advantages": [1, 1]}],
            },
            400,
            "data[0].advantages: length 2 != len(tokens) 3",
        ),
        (
            "/v1/forward_backward",
            {"adapter": "p", "loss": "ppo", "data": [{"tokens": [1, 2, 3]}]},
            400,
            "data[0].old_logprobs",
        ),
        (
            "/v1/forward_backward",
            {"adapter": "p", "loss": "value", "data": [{"tokens": [1, 2]}]},
            400,
            "needs a critic",
        ),
        (
            "/v1/sample",
            {"requests": [{"adapter": "p", "prompt_ids": [1], "sampling": {"top_p": 1.5}}]},
            422,
            "requests[0].sampling.top_p: input should be less than or equal to 1",
        ),
        (
            "/v1/sample",
            {"requests": [{"adapter": "p", "prompt_ids": [1] * 2000}]},
            400,
            "requests[0].prompt_ids",
        ),
        (
            "/v1/sample",
            {"requests": [{"adapter": "p"}]},
            400,
            "requests[0]: give exactly one of messages and prompt_ids",
        ),
        ("/v1/optim_step", {"adapter": "ghost"}, 404, "adapter: unknown adapter 'ghost'"),
        ("/v1/adapters", {"name": "p", "base": "b"}, 409, "already exists"),
        ("/v1/adapters", {"name": "bad.name", "base": "b"}, 400, "name:"),
        ("/v1/bases", {"name": "c", "source": "tiny:nope"}, 400, "source: unknown tiny preset"),
        ("/v1/checkpoint/load", {"path": "/nonexistent/ckpt"}, 403, "path: '/nonexistent/ckpt' resolves to"),
    ],
)
def test_bad_requests_name_the_field_and_the_engine_keeps_serving(
    client: TestClient, path: str, body: dict, status: int, needle: str
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["message"], r.json()
    good_forward(client)


def test_malformed_json_and_unknown_route(client: TestClient) -> None:
    r = client.post(
        "/v1/forward", content=b'{"adapter": "p", "data": [', headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422
    assert "malformed JSON" in r.json()["message"]
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = client.post("/v1/forward", content=b"x" * 10, headers={"Content-Length": str(300 * 1024 * 1024)})
    assert r.status_code == 413
    good_forward(client)


def test_internal_error_is_a_500_and_the_engine_recovers(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(losses, "selected_logprobs_and_entropies", boom)
    r = client.post("/v1/forward", json={"adapter": "p", "data": [{"tokens": [1, 2, 3]}]})
    assert r.status_code == 500
    assert r.json() == {"error": "internal", "message": "RuntimeError: simulated kernel failure"}
    monkeypatch.undo()
    good_forward(client)


def test_round_trip_over_http(client: TestClient) -> None:
    r = client.post(
        "/v1/sample",
        json={
            "requests": [
                {
                    "adapter": "p",
                    "messages": [{"role": "user", "content": "hi"}],
                    "sampling": {"max_new_tokens": 4, "n": 2},
                }
            ],
            "seed": 5,
        },
    )
    assert r.status_code == 200, r.text
    res = r.json()["results"][0]
    assert res["adapter_version"] == 0 and len(res["completions"]) == 2
    toks = res["prompt_ids"] + res["completions"][0]["response_ids"]
    w = [0.0] * len(res["prompt_ids"]) + [1.0] * 4
    fb = client.post(
        "/v1/forward_backward",
        json={
            "adapter": "p",
            "loss": "ppo",
            "data": [
                {
                    "tokens": toks,
                    "weights": w,
                    "old_logprobs": [0.0] * len(toks),
                    "advantages": [1.0] * len(toks),
                }
            ],
        },
    )
    assert fb.status_code == 200, fb.text
    st = client.post("/v1/optim_step", json={"adapter": "p"}).json()
    assert st["version"] == 1 and st["grad_norm"] > 0
    assert client.get("/v1/adapters").json()["adapters"][0]["version"] == 1
    stats = client.get("/v1/stats").json()
    assert stats["tokens_sampled"] >= 8 and stats["tokens_trained"] >= len(toks)
    assert stats["endpoints"]["POST /v1/sample"]["calls"] >= 1
    assert stats["rss_bytes"] > 0
    # the sampler's time, split into admitting rows (prefill) and decode steps; both ran
    assert stats["decode_steps"] > 0 and stats["prefill_seconds"] > 0 and stats["decode_seconds"] > 0
    assert client.get("/v1/bases").json()["bases"][0]["name"] == "b"


def test_a_failing_decode_step_fails_its_call_not_the_engine(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from marft_engine.sampler import Sampler

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("simulated decode failure")

    monkeypatch.setattr(Sampler, "_model_call", boom)
    body = {"requests": [{"adapter": "p", "prompt_ids": [1, 2], "sampling": {"max_new_tokens": 3}}]}
    r = client.post("/v1/sample", json=body)
    assert r.status_code == 500 and "simulated decode failure" in r.json()["message"]
    monkeypatch.undo()
    r = client.post("/v1/sample", json=body)
    assert r.status_code == 200 and len(r.json()["results"][0]["completions"][0]["response_ids"]) == 3


def test_the_servers_connections_answer_without_waiting_for_the_clients_ack() -> None:
    """Every connection accepted on the server's socket has TCP_NODELAY: asyncio sets it only where
    the listening socket says TCP, and without it each answer on a kept-alive connection waited for
    the client's delayed ACK."""
    sock = listen_socket("127.0.0.1", 0)

    async def accept_one() -> list[int]:
        seen: list[int] = []

        async def on_connection(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            seen.append(w.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            w.close()

        server = await asyncio.start_server(on_connection, sock=sock)  # what uvicorn does with it
        reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        await reader.read()  # until the server has looked and closed
        writer.close()
        server.close()
        await server.wait_closed()
        return seen

    assert asyncio.run(accept_one()) == [1]
