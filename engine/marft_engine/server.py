"""The engine's HTTP server: FastAPI routes over one `Engine`, bearer auth, JSON errors, process life.

Run: python -m marft_engine.server --host 127.0.0.1 --port 0 [--device auto|cpu|cuda]
     [--parent-pid PID] [--max-batch 64] [--checkpoint-root DIR] [--replicas N [--ray-address ADDR]
     [--replica-cpus C] [--replica-gpus G] [--replica-threads T]]
When listening it prints one JSON line to stdout: {"event": "ready", "url": "http://127.0.0.1:PORT"}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import __version__
from .errors import BadRequest, EngineError, Unavailable
from .schemas import (
    AdapterCreate,
    AdapterInfo,
    AdapterList,
    BaseCreate,
    BaseInfo,
    BaseList,
    CheckpointRequest,
    CheckpointResponse,
    ErrorBody,
    ForwardBackwardBatch,
    ForwardBackwardBatchResponse,
    ForwardBackwardRequest,
    ForwardBackwardResponse,
    ForwardRequest,
    ForwardResponse,
    Health,
    OptimStepRequest,
    OptimStepResponse,
    RetokenizeRequest,
    RetokenizeResponse,
    SampleBatch,
    SampleResponse,
    Stats,
)

if TYPE_CHECKING:
    from .engine import Engine  # imported in main(): the OpenAPI document needs no torch
    from .replicas import ReplicaGroup  # the same methods, over several engine replicas

log = logging.getLogger("marft_engine")
P = ParamSpec("P")
T = TypeVar("T")

MAX_BODY_BYTES = 256 * 1024 * 1024
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in [
        (400, "Bad request (names the field)"),
        (401, "Missing or wrong bearer token"),
        (403, "A path outside the engine's checkpoint root"),
        (404, "Unknown base or adapter"),
        (409, "Name already taken"),
        (413, "Request body too large"),
        (422, "Validation error (names the field)"),
        (500, "Internal error; the engine keeps serving"),
    ]
}


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content=ErrorBody(error=kind, message=message).model_dump())


def _field_path(loc: Sequence[int | str]) -> str:
    """("body", "requests", 0, "sampling", "top_p") -> "requests[0].sampling.top_p"."""
    out = ""
    for part in loc:
        if part == "body" and out == "":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        path = _field_path(err.get("loc", ()))
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            msg = f"malformed JSON: {ctx.get('error', msg)}"
            path = "body"
        parts.append(f"{path}: {msg[:1].lower() + msg[1:]}")
    return "; ".join(parts) or "invalid request"


# JSON has no NaN or Infinity (RFC 8259), but Python's parser takes them, and 1e999 parses as inf. A body
# where any may be is parsed again to name the field; others cost two substring searches and one regex.
_EXPONENT = re.compile(rb"[eE]\+?[0-9]{3}")


class _NonFinite:
    def __init__(self, text: str) -> None:
        self.text = text


def _parse_float(text: str) -> float | _NonFinite:
    f = float(text)
    return f if math.isfinite(f) else _NonFinite(text)


def non_finite_field(value: object, path: str = "") -> tuple[str, str] | None:
    """(field path, the number as written) of the first non-finite number in a JSON value (parsed
    with `_NonFinite` markers, or a response's model_dump()), or None."""
    if isinstance(value, _NonFinite):
        return path or "body", value.text
    if isinstance(value, float) and not math.isfinite(value):
        return path or "body", repr(value)
    if isinstance(value, dict):
        for k, v in value.items():
            if found := non_finite_field(v, f"{path}.{k}" if path else str(k)):
                return found
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if found := non_finite_field(v, f"{path}[{i}]"):
                return found
    return None


def _body_non_finite(body: bytes) -> tuple[str, str] | None:
    if b"NaN" not in body and b"Infinity" not in body and not _EXPONENT.search(body):
        return None
    try:
        value = json.loads(body, parse_constant=_NonFinite, parse_float=_parse_float)
    except ValueError:
        return None  # not JSON: the validation error names what is wrong
    return non_finite_field(value)


class BodyGuard:
    """Outermost layer: the bearer token; the body limit, counted as the body arrives (a chunked
    upload has no Content-Length to check); no NaN or Infinity anywhere in a JSON body (a 400 that
    names the field: a NaN advantage would silently turn an adapter's weights into NaN)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if not secrets.compare_digest(headers.get(b"authorization", b""), self.expected):
            await _error(401, "unauthorized", "Authorization: Bearer <MARFT_ENGINE_TOKEN> required")(
                scope, receive, send
            )
            return
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            too_large = f"request body is {int(length)} bytes; the limit is {MAX_BODY_BYTES}"
            await _error(413, "too_large", too_large)(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                too_large = f"request body is over {MAX_BODY_BYTES} bytes, the limit"
                await _error(413, "too_large", too_large)(scope, receive, send)
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        if found := _body_non_finite(body):
            field, text = found
            await _error(400, "bad_request", f"{field}: {text} is not a finite number")(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def create_app(engine: Engine | ReplicaGroup | None, token: str) -> FastAPI:
    """The app over `engine` (None: routes exist for the OpenAPI document but answer 503)."""
    app = FastAPI(title="MARFT engine", version=__version__, responses=ERROR_RESPONSES)
    endpoint_stats: dict[str, list[float]] = {}

    @app.middleware("http")
    async def endpoint_times(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        t0 = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        key = f"{request.method} {getattr(route, 'path', request.url.path)}"
        entry = endpoint_stats.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += time.perf_counter() - t0
        return response

    app.add_middleware(BodyGuard, token=token)  # added last: the outermost layer

    @app.exception_handler(RequestValidationError)
    async def on_validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "bad_request", _validation_message(exc))

    @app.exception_handler(EngineError)
    async def on_engine_error(_request: Request, exc: EngineError) -> JSONResponse:
        return _error(exc.status, exc.kind, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "bad_request"}.get(exc.status_code, "bad_request")
        return _error(exc.status_code, kind, str(exc.detail))

    @app.exception_handler(Exception)
    async def on_internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return _error(500, "internal", f"{type(exc).__name__}: {exc}")

    def need() -> Engine | ReplicaGroup:
        if engine is None:
            raise Unavailable("no engine behind this app")
        return engine

    def finite(result: T) -> T:
        # Finite inputs can still drive a result out of range (a huge advantage, a tiny
        # temperature); JSON cannot carry it, and it is the request's doing: a 400, not a 500.
        if isinstance(result, BaseModel) and (found := non_finite_field(result.model_dump())):
            raise BadRequest(
                f"{found[0]}: the result is {found[1]}; the request's values drive it out of range"
            )
        return result

    async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        # Engine calls wait in a worker thread so the event loop keeps accepting requests (the sampler
        # batches concurrent calls); the engine runs them all on its one compute thread.
        return finite(await asyncio.to_thread(fn, *args, **kwargs))

    @app.post("/v1/bases", response_model=BaseInfo)
    async def create_base(body: BaseCreate) -> BaseInfo:
        return await run(need().create_base, body)

    @app.get("/v1/bases", response_model=BaseList)
    async def list_bases() -> BaseList:
        return await run(need().list_bases)

    @app.post("/v1/adapters", response_model=AdapterInfo)
    async def create_adapter(body: AdapterCreate) -> AdapterInfo:
        return await run(need().create_adapter, body)

    @app.get("/v1/adapters", response_model=AdapterList)
    async def list_adapters() -> AdapterList:
        return await run(need().list_adapters)

    @app.delete("/v1/adapters/{name}", response_model=AdapterInfo)
    async def delete_adapter(name: str) -> AdapterInfo:
        return await run(need().delete_adapter, name)

    @app.post("/v1/sample", response_model=SampleResponse)
    async def sample(body: SampleBatch) -> SampleResponse:
        # Admission runs on the compute thread (it may wait for a decode step), so off the event loop;
        # then the call just waits for its rows to finish in the shared decode batch.
        future = await run(need().submit_sample, body)
        return finite(await asyncio.wrap_future(future))

    @app.post("/v1/forward", response_model=ForwardResponse)
    async def forward(body: ForwardRequest) -> ForwardResponse:
        return await run(need().forward, body)

    @app.post("/v1/forward_backward", response_model=ForwardBackwardResponse)
    async def forward_backward(body: ForwardBackwardRequest) -> ForwardBackwardResponse:
        return await run(need().forward_backward, body)

    @app.post("/v1/forward_backward_batch", response_model=ForwardBackwardBatchResponse)
    async def forward_backward_batch(body: ForwardBackwardBatch) -> ForwardBackwardBatchResponse:
        return await run(need().forward_backward_batch, body)

    @app.post("/v1/retokenize", response_model=RetokenizeResponse)
    async def retokenize(body: RetokenizeRequest) -> RetokenizeResponse:
        return await run(need().retokenize, body)

    @app.post("/v1/optim_step", response_model=OptimStepResponse)
    async def optim_step(body: OptimStepRequest) -> OptimStepResponse:
        return await run(need().optim_step, body)

    @app.post("/v1/checkpoint/save", response_model=CheckpointResponse)
    async def checkpoint_save(body: CheckpointRequest) -> CheckpointResponse:
        return await run(need().save_checkpoint, body)

    @app.post("/v1/checkpoint/load", response_model=CheckpointResponse)
    async def checkpoint_load(body: CheckpointRequest) -> CheckpointResponse:
        return await run(need().load_checkpoint, body)

    @app.get("/v1/health", response_model=Health)
    async def health() -> Health:
        eng = need()
        return Health(status="ok", version=__version__, device=eng.device_name, progress=eng.progress())

    @app.get("/v1/stats", response_model=Stats)
    async def stats() -> Stats:
        return await run(need().stats, {k: (int(v[0]), float(v[1])) for k, v in endpoint_stats.items()})

    return app


# ----------------------------------------------------------------------------------------------------
# process


def _watch_parent(parent_pid: int, stop: Callable[[], None]) -> None:
    """Exit when the parent is gone, so a killed CLI never leaves an orphan engine."""
    while True:
        time.sleep(1.0)
        if _process_gone(parent_pid):
            log.info("parent %d is gone; exiting", parent_pid)
            stop()
            time.sleep(10.0)  # a graceful stop waits for running calls; an orphan must not linger
            log.warning("still running 10 s after the parent left; exiting now")
            os._exit(0)


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, owned by someone else
    try:  # a killed process that nobody has reaped yet still answers kill(0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def listen_socket(host: str, port: int) -> socket.socket:
    """Bound (port 0: any free port), naming IPPROTO_TCP: only then does asyncio set TCP_NODELAY on
    accepted connections, and without it each kept-alive answer waited for the client's delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="marft_engine.server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = an OS-chosen free port")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--max-batch", type=int, default=64, help="most rows in one decode batch")
    parser.add_argument(
        "--checkpoint-root",
        default="runs",
        help="every checkpoint path must lie in this directory (default ./runs; the CLI passes the run "
        "directory's parent)",
    )
    parser.add_argument("--log-level", default="info")
    group = parser.add_argument_group("replicas (on Ray; without these flags: one engine in this process)")
    group.add_argument("--replicas", type=int, default=1, help="engine replicas, each a Ray actor")
    group.add_argument(
        "--ray-address", default=None, help="join this Ray cluster (default: start a local one)"
    )
    group.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves per replica")
    group.add_argument(
        "--replica-gpus",
        type=float,
        default=None,
        help="GPUs per replica (default: 1 if the cluster has enough)",
    )
    group.add_argument(
        "--replica-threads", type=int, default=None, help="torch threads per replica (default: its CPUs)"
    )
    args = parser.parse_args(argv)
    if args.replicas < 1:
        parser.error("--replicas: expected at least 1")

    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s engine %(levelname)s %(message)s"
    )
    token = os.environ.get("MARFT_ENGINE_TOKEN")
    if not token:
        token = secrets.token_urlsafe(24)
        print(f"MARFT_ENGINE_TOKEN not set; generated token: {token}", file=sys.stderr, flush=True)

    import uvicorn

    def stop() -> None:
        server.should_exit = True

    engine: Engine | ReplicaGroup
    if args.replicas > 1 or args.ray_address is not None:
        from .replicas import ReplicaGroup, ReplicaOptions

        options = ReplicaOptions(
            replicas=args.replicas,
            device=args.device,
            max_batch=args.max_batch,
            cpus=args.replica_cpus,
            gpus=args.replica_gpus,
            threads=args.replica_threads,
            address=args.ray_address,
            checkpoint_root=args.checkpoint_root,
        )
        engine = ReplicaGroup(options, on_lost=stop)  # when every replica died: stop, to be restarted
    else:
        from .engine import Engine

        engine = Engine(device=args.device, max_batch=args.max_batch, checkpoint_root=args.checkpoint_root)
    log.info("checkpoint root: %s", engine.checkpoint_root)
    maps = Path("/proc/self/maps")
    preloaded = maps.exists() and "libtcmalloc" in maps.read_text()  # by the launcher (engineAllocatorEnv)
    log.info("memory allocator: %s", "tcmalloc" if preloaded else "the C library's malloc")
    app = create_app(engine, token)

    sock = listen_socket(args.host, args.port)
    port = sock.getsockname()[1]

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the signal after its graceful shutdown (exit status -15); a SIGTERM or
            # SIGINT is the normal way to stop the engine, so stop gracefully and exit 0 instead.
            def on_signal(_sig: int, _frame: object) -> None:
                self.should_exit = True

            previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = Server(config)

    if args.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, stop), daemon=True).start()

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.02)
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(json.dumps({"event": "ready", "url": f"http://{host}:{port}"}), flush=True)
        await task

    # uvicorn installs SIGINT/SIGTERM handlers that set should_exit: a clean shutdown either way.
    asyncio.run(serve())
    engine.close()
    log.info("engine stopped")
    lost = bool(getattr(engine, "lost", False))  # every replica died: not a clean stop
    # Exit now: a call still on the compute thread (close() waits 10 s for it) would otherwise hold
    # the worker thread that waits for it, and the interpreter joins those threads at exit.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(1 if lost else 0)


if __name__ == "__main__":
    main()
