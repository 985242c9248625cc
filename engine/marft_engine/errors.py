"""The one exception type the engine raises for client errors; the server maps it to ErrorBody."""

from __future__ import annotations


class EngineError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


def bad_request(message: str) -> EngineError:
    return EngineError(400, "bad_request", message)


def not_found(message: str) -> EngineError:
    return EngineError(404, "not_found", message)
