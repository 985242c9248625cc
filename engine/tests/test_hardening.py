"""Hostile and broken input: checkpoints are data (a crafted one runs nothing), checkpoint paths stay
inside the root, a save replaces only checkpoints, non-finite numbers are 400s that name the field,
the body limit holds for chunked uploads, and nothing the inputs drive out of range reaches the
weights."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file

from marft_engine import server
from marft_engine.delays import Delay, parse
from marft_engine.engine import Engine
from marft_engine.server import create_app

TOKEN = "t"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("root")


@pytest.fixture(scope="module")
def client(root: Path) -> Iterator[TestClient]:
    eng = Engine(device="cpu", checkpoint_root=str(root))
    with TestClient(create_app(eng, TOKEN), headers=AUTH, raise_server_exceptions=False) as c:
        assert c.post("/v1/bases", json={"name": "b", "source": "tiny:llama", "dtype": "float32"}).is_success
        assert c.post("/v1/adapters", json={"name": "p", "base": "b", "lora": {"r": 2}}).is_success
        critic = {"name": "v", "base": "b", "kind": "critic", "value_head_hidden": [8]}
        assert c.post("/v1/adapters", json=critic).is_success
        yield c
    eng.close()


def weights(c: TestClient) -> list[float]:
    r = c.post("/v1/forward", json={"adapter": "p", "data": [{"tokens": [1, 2, 3, 4]}]})
    assert r.status_code == 200, r.text
    return r.json()["results"][0]["logprobs"]


class RunsCode:
    """Unpickling this runs a shell command: what a crafted checkpoint file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_is_refused_and_runs_nothing(client: TestClient, root: Path) -> None:
    ck = root / "crafted"
    assert client.post("/v1/checkpoint/save", json={"path": str(ck), "adapters": ["p"]}).is_success
    marker = root / "pwned"
    # format 1 read pickles: make it one whose optimizer and RNG files run a command when unpickled
    manifest = json.loads((ck / "manifest.json").read_text())
    (ck / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    for f in (ck / "adapters" / "p" / "optimizer.pt", ck / "rng.pt"):
        torch.save({"state": RunsCode(marker)}, f)  # torch.load(weights_only=False) would run it
    before = weights(client)
    r = client.post("/v1/checkpoint/load", json={"path": str(ck)})
    assert not marker.exists()
    assert r.status_code == 400, r.text
    assert "cannot read the checkpoint" in r.json()["message"] and "UnpicklingError" in r.json()["message"]
    assert weights(client) == before
    # a format-2 checkpoint never opens a pickle: a hostile .pt beside it is not read
    assert client.post("/v1/checkpoint/save", json={"path": str(ck)}).is_success
    torch.save(RunsCode(marker), ck / "adapters" / "p" / "optimizer.pt")
    assert client.post("/v1/checkpoint/load", json={"path": str(ck)}).is_success
    assert not marker.exists()


def test_a_format_1_checkpoint_of_plain_data_still_loads(client: TestClient, root: Path) -> None:
    ck = root / "legacy"
    assert client.post("/v1/checkpoint/save", json={"path": str(ck)}).is_success
    manifest = json.loads((ck / "manifest.json").read_text())
    (ck / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    # what format 1 wrote: torch.save of the optimizer state dict and of the RNG states
    random.seed(5)
    np.random.seed(5)
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    torch.save(rng, ck / "rng.pt")
    for name in ("p", "v"):
        d = ck / "adapters" / name
        tensors = load_file(d / "optimizer.safetensors")
        meta = json.loads((d / "optimizer.json").read_text())
        state: dict[int, dict[str, object]] = {}
        for key, t in tensors.items():
            pid, k = key.split(".", 1)
            state.setdefault(int(pid), {})[k] = t
        torch.save({"state": state, "param_groups": meta["param_groups"]}, d / "optimizer.pt")
        (d / "optimizer.json").unlink()
        (d / "optimizer.safetensors").unlink()
    (ck / "rng.json").unlink()
    (ck / "rng.safetensors").unlink()
    random.seed(0)
    r = client.post("/v1/checkpoint/load", json={"path": str(ck)})
    assert r.status_code == 200, r.text
    assert random.random() == (lambda g: g.random())(random.Random(5))  # the python RNG state came back


def test_checkpoint_paths_stay_inside_the_root(client: TestClient, root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"  # tmp_path is not under this engine's root
    (root / "link").symlink_to(tmp_path, target_is_directory=True)
    for path in (str(outside), f"{root}/../{root.name}-x", f"{root}/link/ck", "../escape", "/etc/cron.d/x"):
        for op in ("save", "load"):
            r = client.post(f"/v1/checkpoint/{op}", json={"path": path})
            assert r.status_code == 403, (op, path, r.text)
            assert r.json()["message"].startswith(f"path: {path!r} resolves to"), r.json()
    assert not outside.exists() and not list(tmp_path.iterdir())
    # a relative path is taken from the root
    r = client.post("/v1/checkpoint/save", json={"path": "rel/ck"})
    assert r.status_code == 400 and "parent directory" in r.json()["message"]
    (root / "rel").mkdir()
    r = client.post("/v1/checkpoint/save", json={"path": "rel/ck"})
    assert r.status_code == 200 and r.json()["path"] == str((root / "rel" / "ck").resolve())


def test_save_replaces_only_a_marft_checkpoint(client: TestClient, root: Path) -> None:
    keep = root / "precious"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    r = client.post("/v1/checkpoint/save", json={"path": str(keep)})
    assert r.status_code == 409, r.text
    assert "is not a MARFT checkpoint" in r.json()["message"]
    assert (keep / "notes.txt").read_text() == "mine"
    (root / "afile").write_text("x")
    assert client.post("/v1/checkpoint/save", json={"path": str(root / "afile")}).status_code == 409
    for path in (str(root), "", "."):
        r = client.post("/v1/checkpoint/save", json={"path": path})
        assert r.status_code == 400 and "checkpoint root itself" in r.json()["message"], r.text
    assert (keep / "notes.txt").exists() and (root / "afile").exists()
    # a checkpoint is replaced, and nothing temporary is left beside it
    ck = root / "again"
    assert client.post("/v1/checkpoint/save", json={"path": str(ck)}).is_success
    assert client.post("/v1/checkpoint/save", json={"path": str(ck)}).is_success
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("again")) == ["again"]


def test_a_damaged_manifest_is_a_400(client: TestClient, root: Path) -> None:
    ck = root / "damaged"
    assert client.post("/v1/checkpoint/save", json={"path": str(ck), "adapters": ["p"]}).is_success
    good = json.loads((ck / "manifest.json").read_text())
    bad = [
        "{not json",
        json.dumps({**good, "adapters": {"p": {**good["adapters"]["p"], "lora": {"r": -1}}}}),
        json.dumps({**good, "adapters": {"../../x": good["adapters"]["p"]}}),
        json.dumps({"format": 2}),
    ]
    for text in bad:
        (ck / "manifest.json").write_text(text)
        r = client.post("/v1/checkpoint/load", json={"path": str(ck)})
        assert r.status_code == 400, (text, r.text)
        assert r.json()["message"].startswith("path:"), r.json()
    (ck / "manifest.json").write_text(json.dumps(good))
    (ck / "adapters" / "p" / "adapter_model.safetensors").write_bytes(b"garbage")
    r = client.post("/v1/checkpoint/load", json={"path": str(ck)})
    assert r.status_code == 400 and "is not a readable PEFT folder" in r.json()["message"], r.text
    assert r.json()["message"].startswith("path:"), r.text


@pytest.mark.parametrize(
    ("text", "field", "literal"),
    [
        ('"old_logprobs": [0, NaN, 0, 0]', "data[0].old_logprobs[1]", "NaN"),
        (
            '"old_logprobs": [0, 0, 0, 0], "advantages": [0, Infinity, 1, 1]',
            "data[0].advantages[1]",
            "Infinity",
        ),
        ('"old_logprobs": [0, 0, -Infinity, 0]', "data[0].old_logprobs[2]", "-Infinity"),
        ('"old_logprobs": [0, 0, 0, 1e999]', "data[0].old_logprobs[3]", "1e999"),
        ('"old_logprobs": [0, -1E+400, 0, 0]', "data[0].old_logprobs[1]", "-1E+400"),
    ],
)
def test_non_finite_numbers_are_400s_naming_the_field(
    client: TestClient, text: str, field: str, literal: str
) -> None:
    before = weights(client)
    if "advantages" not in text:
        text += ', "advantages": [0, 1, 1, 1]'
    body = '{"adapter": "p", "loss": "ppo", "data": [{"tokens": [1, 2, 3, 4], ' + text + "}]}"
    r = client.post("/v1/forward_backward", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json() == {"error": "bad_request", "message": f"{field}: {literal} is not a finite number"}
    assert client.post("/v1/optim_step", json={"adapter": "p"}).is_success
    after = weights(client)
    assert after == before and all(np.isfinite(after))


@pytest.mark.parametrize(
    ("body", "found"),
    [
        (b'{"a": [1, -2.5, 3e-7], "text": "NaN is no number"}', None),  # a string that spells NaN
        (b'{"a": [1, -2.5, 3e-7], "b": "e123"}', None),  # looks like an exponent: parsed, finite
        (b'{"a": [1.5e+300, 2E100, -1e-400]}', None),  # large, yet finite; underflow is 0
        (b'{"a": [1, {"b": [2, 1E+400]}]}', ("a[1].b[1]", "1E+400")),
        (b'{"a": [1, 2e308]}', ("a[1]", "2e308")),
        (b'{"a": -Infinity}', ("a", "-Infinity")),
    ],
)
def test_the_body_scan_finds_exactly_the_non_finite_numbers(
    body: bytes, found: tuple[str, str] | None
) -> None:
    """The server's scan before validation: the cheap checks only decide whether to parse again."""
    assert server._body_non_finite(body) == found


def test_values_that_overflow_never_reach_the_weights(client: TestClient) -> None:
    """Finite but huge inputs: the loss overflows. The call is a 400, its gradients are dropped, and
    the next step leaves the weights as they were."""
    before = weights(client)
    datum = {
        "tokens": [1, 2, 3, 4],
        "old_logprobs": [0, -1e30, -1e30, -1e30],
        "advantages": [0, -1e30, -1, -1],
    }
    r = client.post("/v1/forward_backward", json={"adapter": "p", "loss": "ppo", "data": [datum]})
    assert r.status_code == 400, r.text
    assert "gradients were dropped" in r.json()["message"]
    assert client.post("/v1/optim_step", json={"adapter": "p"}).is_success
    assert weights(client) == before
    r = client.post("/v1/forward", json={"adapter": "p", "data": [{"tokens": [1, 2]}], "temperature": 1e-300})
    assert r.status_code == 400 and "results[0].logprobs[1]: the result is" in r.json()["message"], r.text


def test_the_body_limit_holds_for_chunked_uploads(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "MAX_BODY_BYTES", 1000)

    def chunks() -> Iterator[bytes]:  # no Content-Length: httpx sends it chunked
        yield b'{"adapter": "p", "data": [{"tokens": [1'
        for _ in range(500):
            yield b", 1"
        yield b"]}]}"

    r = client.post("/v1/forward", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text[:300]
    assert "limit" in r.json()["message"]
    monkeypatch.undo()
    assert client.post(
        "/v1/forward", content=chunks(), headers={"Content-Type": "application/json"}
    ).is_success


def test_health_reports_progress(client: TestClient) -> None:
    a = client.get("/v1/health").json()["progress"]
    weights(client)
    b = client.get("/v1/health").json()["progress"]
    assert b["beats"] > a["beats"] and b["compute_cpu_seconds"] >= a["compute_cpu_seconds"]


def test_test_delays_parse() -> None:
    assert parse("sample=2, save_checkpoint=0.5:stall") == {
        "sample": Delay(2.0, False),
        "save_checkpoint": Delay(0.5, True),
    }
    with pytest.raises(SystemExit, match="expected name=SECONDS"):
        parse("sample=soon")
    with pytest.raises(SystemExit, match="expected name=SECONDS"):
        parse("sample=1:forever")


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [  # each of these was a 500 (found by probing what the fuzzer reaches)
        (
            "/v1/adapters",
            {"name": "q1", "base": "b", "optimizer": {"betas": [2, 0.9]}},
            422,
            "optimizer.betas[0]",
        ),
        (
            "/v1/adapters",
            {"name": "q2", "base": "b", "kind": "critic", "value_head_hidden": [-1]},
            422,
            "value_head_hidden[0]",
        ),
        ("/v1/adapters", {"name": "q3", "base": "b", "seed": 2**70}, 422, "seed: input should be less than"),
        (
            "/v1/bases",
            {"name": "c", "source": "tiny:llama", "seed": 2**70},
            422,
            "seed: input should be less than",
        ),
        (
            "/v1/checkpoint/save",
            {"path": "x" * 300},
            400,
            "path: the path is longer than the filesystem allows",
        ),
        (
            "/v1/checkpoint/load",
            {"path": "a/" * 3000},
            400,
            "path: the path is longer than the filesystem allows",
        ),
    ],
)
def test_malformed_input_is_a_4xx_naming_the_field(
    client: TestClient, path: str, body: dict, status: int, needle: str
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["message"], r.json()
    assert client.get("/v1/health").is_success


@pytest.mark.parametrize(
    ("config", "weights"),
    [('{"r": 2', b"x"), ('{"r": "eight"}', b"x"), ('{"r": 2}', b"not safetensors"), ("[]", b"x")],
)
def test_a_broken_peft_folder_is_a_400(
    client: TestClient, tmp_path: Path, config: str, weights: bytes
) -> None:
    (tmp_path / "adapter_config.json").write_text(config)
    (tmp_path / "adapter_model.safetensors").write_bytes(weights)
    r = client.post("/v1/adapters", json={"name": "broken", "base": "b", "init_from": str(tmp_path)})
    assert r.status_code == 400, r.text
    assert r.json()["message"].startswith(f"init_from: {str(tmp_path)!r} is not a readable PEFT folder"), (
        r.text
    )
