"""The errors the engine raises for requests it refuses; the server answers each with its status and
an ErrorBody {error: kind, message}. Anything else that escapes an engine call is an internal error
(500, logged by the server)."""

from __future__ import annotations


class EngineError(Exception):
    status: int  # the HTTP status
    kind: str  # ErrorBody.error

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(EngineError):
    """A value in the request is wrong; the message starts with its field path."""

    status = 400
    kind = "bad_request"


class Forbidden(EngineError):
    """A path outside what the engine may touch (checkpoints: the root it was started with)."""

    status = 403
    kind = "forbidden"


class NotFound(EngineError):
    status = 404
    kind = "not_found"


class Conflict(EngineError):
    """A name is taken, or an adapter went away while a call used it."""

    status = 409
    kind = "conflict"


class Unavailable(EngineError):
    status = 503
    kind = "unavailable"
