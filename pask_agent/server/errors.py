"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with its status.

Why a table and not a handler per error: every ``PaskError`` the runtime raises on purpose says
what the caller got wrong or what the server could not do, so the status follows from its
class alone (most specific class first). Anything else is a bug and answers 500.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from pask_agent.errors import (
    ConfigError,
    DDLError,
    GrammarRejectedError,
    PaskError,
    PolicyTableError,
    RequestTooLargeError,
    SchemaError,
    ToolChoiceError,
    ValidationFailedError,
)


class APIError(Exception):
    """An error answered to the client as ``status`` + OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"


# (error class, status, OpenAI type, code), most specific class first.
_STATUS: tuple[tuple[type[PaskError], int, str, str], ...] = (
    (RequestTooLargeError, 413, "invalid_request_error", "context_length_exceeded"),
    (SchemaError, 400, "invalid_request_error", "invalid_schema"),
    (ToolChoiceError, 400, "invalid_request_error", "invalid_tool_choice"),
    (DDLError, 400, "invalid_request_error", "invalid_schema"),
    (ConfigError, 400, "invalid_request_error", "invalid_value"),
    # the server's own policy is checked at startup, so this is a request's pask_policy
    (PolicyTableError, 400, "invalid_request_error", "policy_unavailable"),
    # The model's answer broke the requested schema (a numeric range the grammar cannot bind):
    # not the client's fault, and a retry with sampling may succeed.
    (ValidationFailedError, 500, "server_error", "invalid_model_output"),
    (GrammarRejectedError, 500, "server_error", "grammar_rejected"),
)


def api_error(exc: BaseException) -> APIError:
    """The client-facing error for an exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, PaskError):
        for cls, status, kind, code in _STATUS:
            if isinstance(exc, cls):
                param = getattr(exc, "path", None) if isinstance(exc, SchemaError) else None
                return APIError(status, str(exc), kind, param, code)
        return APIError(500, str(exc), "server_error", None, type(exc).__name__)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)
