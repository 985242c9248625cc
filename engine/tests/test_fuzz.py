"""OpenAPI-driven fuzzing (schemathesis) of a real engine process with the tiny model: valid and
invalid bodies for every endpoint, a bounded number of examples each. No input may get a 5xx, and the
engine must keep serving (health after every operation's examples, and a real call at the end).

Generated bodies name random adapters and bases, which the engine answers with a 404 before looking
further; half of them are pointed at the engine's real adapters and base, so the checks behind the
lookup are reached too. Sampling lengths are capped (the fuzzer's aim is malformed input, not a long decode).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = int(os.environ.get("MARFT_FUZZ_EXAMPLES", "25"))  # per endpoint: ~13 x 25 requests
schema = schemathesis.openapi.from_path(Path(__file__).parent.parent / "openapi.json")


def _pick(body: object, options: list[str]) -> str | None:
    """Deterministic by the body (hypothesis replays must see the same case): a known name or None."""
    h = zlib.crc32(json.dumps(body, sort_keys=True, default=str).encode())
    return options[h % len(options)] if h % 2 == 0 else None


@schema.hook
def map_body(_ctx: schemathesis.HookContext, body: object) -> object:
    if not isinstance(body, dict):
        return body
    if isinstance(body.get("adapter"), str) and (name := _pick(body, ["p", "v", "__base__"])):
        body["adapter"] = name
        if name == "__base__":
            body["base"] = "b"
    elif isinstance(body.get("base"), str) and _pick(body, ["b"]):  # AdapterCreate
        body["base"] = "b"
    if isinstance(body.get("name"), str) and _pick(body, ["x"]):  # a valid, fresh name
        body["name"] = f"f{zlib.crc32(json.dumps(body, sort_keys=True, default=str).encode()):x}"
    for req in body.get("requests") or []:
        if not isinstance(req, dict):
            continue
        if isinstance(req.get("adapter"), str) and (name := _pick(req, ["p", "__base__"])):
            req["adapter"] = name
            req["base"] = "b" if name == "__base__" else req.get("base")
        sp = req.get("sampling")
        if isinstance(sp, dict):
            for key, cap in (("max_new_tokens", 4), ("n", 3)):
                if isinstance(sp.get(key), int) and not isinstance(sp[key], bool) and sp[key] > cap:
                    sp[key] = cap
    return body


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("fuzz-root")
    env = dict(os.environ, OMP_NUM_THREADS="1", MARFT_ENGINE_TOKEN=TOKEN)
    proc = subprocess.Popen(
        [sys.executable, "-m", "marft_engine.server", "--port", "0", "--device", "cpu"]
        + ["--checkpoint-root", str(root), "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    base = json.loads(proc.stdout.readline())["url"]
    with httpx.Client(base_url=base, headers=AUTH, timeout=60) as c:
        assert c.post("/v1/bases", json={"name": "b", "source": "tiny:llama", "dtype": "float32"}).is_success
        assert c.post("/v1/adapters", json={"name": "p", "base": "b", "lora": {"r": 2}}).is_success
        critic = {"name": "v", "base": "b", "kind": "critic", "value_head_hidden": [4]}
        assert c.post("/v1/adapters", json=critic).is_success
    yield base
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    # an unexpected exception on the server is logged as "internal error" with its traceback
    assert "internal error" not in err, err[-3000:]


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure here is reproducible
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_no_input_gets_a_5xx(case: schemathesis.Case, url: str) -> None:
    response = case.call(base_url=url, headers=AUTH)
    case.validate_response(response, checks=[not_a_server_error])


def test_the_engine_still_serves_after_the_fuzzing(url: str) -> None:
    with httpx.Client(base_url=url, headers=AUTH, timeout=60) as c:
        assert c.get("/v1/health").json()["status"] == "ok"
        c.post("/v1/adapters", json={"name": "after", "base": "b"})
        r = c.post("/v1/sample", json={"requests": [{"adapter": "after", "prompt_ids": [1, 2, 3]}]})
        assert r.status_code == 200, r.text
