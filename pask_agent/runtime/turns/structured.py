"""``rt.call(schema, prompt)`` for a Pydantic model class or a JSON Schema dict: the schema the
answer is bound to, the prompt that states its fields, and the typed value the answer parses to.

The grammar makes the answer well-formed JSON of the schema's shape; validation still runs,
because an answer cut by ``max_new_tokens`` is not, and because a JSON Schema can state what a
grammar does not enforce (formats, numeric bounds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from pask_agent.errors import ConfigError, ValidationFailedError
from pask_agent.runtime.turns.outputs import schema_prompt
from pask_agent.runtime.turns.results import ChatResult


@dataclass(frozen=True, slots=True)
class StructuredSchema:
    json_schema: dict[str, Any]
    model_cls: type | None  # the Pydantic class the value is built as, if one was given

    @classmethod
    def of(cls, schema: Any) -> StructuredSchema:
        """Raises ``ConfigError`` for anything but a Pydantic model class or a schema dict."""
        if is_pydantic_class(schema):
            return cls(schema.model_json_schema(), schema)
        if isinstance(schema, dict):
            return cls(schema, None)
        raise ConfigError(
            "schema must be a Pydantic model class, a JSON Schema dict, or a "
            f"list of tools; got {type(schema).__name__}"
        )

    def prompt(self, prompt: str) -> str:
        # the field list after the request: the small default model follows it best there
        return f"{prompt}\n\n{schema_prompt(self.json_schema)}"

    def value(self, result: ChatResult) -> Any:
        """The answer as a validated instance (or dict); ``ValidationFailedError`` otherwise."""
        try:
            value = json.loads(result.text)
            if self.model_cls is not None:
                return self.model_cls.model_validate(value)  # type: ignore[attr-defined]
            jsonschema.validate(value, self.json_schema)
            return value
        except Exception as exc:  # noqa: BLE001 - re-raised typed, with the answer attached
            raise ValidationFailedError(
                f"answer does not validate ({exc}); raise max_new_tokens if it was cut "
                f"(finish_reason={result.finish_reason}): {result.text[:200]!r}"
            ) from exc


def is_pydantic_class(obj: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(obj, type) and issubclass(obj, BaseModel)
