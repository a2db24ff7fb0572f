"""The server's one error type: an error answered with an HTTP status and OpenAI's error body."""

from __future__ import annotations

from typing import Any

__all__ = ["APIError", "error_body"]


class APIError(Exception):
    """An error answered with ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None):  # noqa: A002 - OpenAI's field name
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error",
                             503: "server_error", 500: "server_error"}.get(status, "invalid_request_error")


def error_body(e: APIError) -> dict[str, Any]:
    return {"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}}
