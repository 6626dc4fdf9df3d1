"""Refusals as OpenAI's API words them: ``{"error": {"message", "type", "param", "code"}}`` with a status."""
from __future__ import annotations

from typing import Any

# status -> the error type OpenAI's API gives it
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "service_unavailable"}


class ApiError(Exception):
    """A request refused with ``status``; ``param`` names the body key at fault, ``code`` a short slug."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The JSON body of an error response."""
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error" if status < 500
                                                                else "server_error"),
                      "param": param, "code": code}}


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    """A 400: a body or value the server cannot take."""
    return ApiError(400, message, param=param, code=code)
