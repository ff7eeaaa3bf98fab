"""Typed errors. Every error says what went wrong and what to do about it.

Rejected tokens and other expected outcomes are return values; these exceptions are for bad
input, missing installs and broken files.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class PaskError(Exception):
    """Base class of every error pask-agent raises on purpose."""


class ModelNotAvailableError(PaskError):
    """A model name, folder or package cannot be found; the message names the install command."""


class ModelHashMismatchError(ModelNotAvailableError):
    """Installed model package files are not the pinned model (SHA-256 differs)."""


class ModelCacheError(PaskError):
    """A converted-model cache folder is unusable and could not be rebuilt."""


class SchemaError(PaskError):
    """A tool spec or JSON Schema cannot be compiled; ``path`` is the JSON path of the problem."""

    def __init__(self, message: str, *, path: str = "$") -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.reason = message


class ToolChoiceError(PaskError):
    """``tool_choice`` names no known tool or is not one of auto/required/any/none."""


class DDLError(PaskError):
    """SQLite DDL could not be parsed into tables and columns."""


class GrammarRejectedError(PaskError):
    """Text was fed to a grammar or tagger that does not accept it (position and reason given)."""

    def __init__(self, message: str, *, token_index: int | None = None) -> None:
        super().__init__(message)
        self.token_index = token_index


class PolicyTableError(PaskError):
    """A policy table file is corrupt, invalid, or made for another model."""


class KVStoreError(PaskError):
    """A KV store operation was asked for something impossible (unknown sequence, bad shape)."""


class ConfigError(PaskError):
    """A configuration value is out of range or inconsistent."""


class RequestTooLargeError(ConfigError):
    """A request can never run as asked: its prompt plus ``max_new_tokens`` exceed the model's
    context, or its KV demand (what its policy keeps: ``runtime/memory/admission.py``) exceeds
    ``RuntimeConfig.kv_capacity_bytes``.

    Raised when the request is made, before it queues: admission waits for room only when the
    request could fit once others finish.
    """


class ValidationFailedError(PaskError):
    """The model's answer did not validate against the requested schema."""


class ToolCallError(ValidationFailedError):
    """A tool call the model wrote breaks its tool's schema (checked with ``jsonschema``).

    ``tool`` is the tool's name and ``path`` the JSON path of the offending argument.
    """

    def __init__(self, message: str, *, tool: str, path: str = "$") -> None:
        super().__init__(message)
        self.tool = tool
        self.path = path


def exit_code(command: Callable[[], int], prefix: str = "error") -> int:
    """Run a command line's work: a typed error (or a task group of them, as the runtime's
    raise) is printed as ``<prefix>: <message>`` and gives exit status 2; anything else is a
    bug and propagates with its traceback."""
    try:
        return int(command() or 0)
    except PaskError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:
        match, rest = group.split(PaskError)
        if match is None or rest is not None:
            raise
        stack: list[BaseException] = [match]
        while stack:
            exc = stack.pop(0)
            if isinstance(exc, BaseExceptionGroup):
                stack[:0] = list(exc.exceptions)
            else:
                print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
