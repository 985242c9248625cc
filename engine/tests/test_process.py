"""The server as a process: ready line, auth, concurrent calls sharing a batch, SIGTERM, parent death."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

TOKEN = "proc-token"


def start(extra: list[str], env_token: str | None = TOKEN) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MARFT_ENGINE_TOKEN", None)
    if env_token is not None:
        env["MARFT_ENGINE_TOKEN"] = env_token
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marft_engine.server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--device",
            "cpu",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    ready = json.loads(line)
    assert ready["event"] == "ready" and ready["url"].startswith("http://127.0.0.1:")
    return proc, ready["url"]


def wait_exit(proc: subprocess.Popen[str], seconds: float) -> int | None:
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def test_ready_line_auth_concurrent_batching_and_sigterm() -> None:
    proc, url = start(["--max-batch", "16"])
    try:
        assert httpx.get(f"{url}/v1/health").status_code == 401
        h = {"Authorization": f"Bearer {TOKEN}"}
        c = httpx.Client(base_url=url, headers=h, timeout=60)
        assert c.get("/v1/health").json()["status"] == "ok"
        assert c.post("/v1/bases", json={"name": "b", "source": "tiny:llama"}).status_code == 200
        assert c.post("/v1/adapters", json={"name": "p", "base": "b"}).status_code == 200

        def req(i: int) -> dict:
            return {
                "requests": [
                    {
                        "adapter": "p" if i % 2 else "__base__",
                        "base": "b",
                        "prompt_ids": list(range(1, 4 + i)),
                        "seed": i,
                        "sampling": {"max_new_tokens": 40 + 5 * i, "temperature": 0.8},
                    }
                ]
            }

        alone = [c.post("/v1/sample", json=req(i)).json() for i in range(6)]
        with ThreadPoolExecutor(6) as pool:
            together = list(pool.map(lambda i: c.post("/v1/sample", json=req(i)).json(), range(6)))
        for a, t in zip(alone, together, strict=True):
            assert (
                a["results"][0]["completions"][0]["response_ids"]
                == t["results"][0]["completions"][0]["response_ids"]
            )
        proc.send_signal(signal.SIGTERM)
        assert wait_exit(proc, 15) == 0
    finally:
        proc.kill()


def test_generated_token_is_printed_to_stderr() -> None:
    proc, url = start([], env_token=None)
    try:
        proc.send_signal(signal.SIGINT)
        assert wait_exit(proc, 15) is not None
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "generated token:" in err
        token = err.split("generated token:")[1].split()[0]
        assert len(token) >= 20
    finally:
        proc.kill()


def test_engine_exits_when_its_parent_dies() -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    proc, url = start(["--parent-pid", str(parent.pid)])
    try:
        assert httpx.get(f"{url}/v1/health", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        time.sleep(1.5)
        assert proc.poll() is None  # alive while the parent is
        parent.kill()  # not reaped yet: a zombie still answers kill(pid, 0)
        assert wait_exit(proc, 10) is not None
        parent.wait()
    finally:
        parent.kill()
        proc.kill()
