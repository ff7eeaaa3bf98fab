"""The ways a model's linear layers can hold their weights, named once for the runtime, the
loaders and the command lines (which import this without importing torch).
``quantized_linear.py`` says what each one is and costs."""

from __future__ import annotations

__all__ = ["DEFAULT_WEIGHTS", "WEIGHT_FORMATS", "weight_formats"]

WEIGHT_FORMATS: tuple[str, ...] = ("fp32", "int8", "int4")
DEFAULT_WEIGHTS = "fp32"  # what load_model and RuntimeConfig use unless told


def weight_formats(text: str) -> list[str]:
    """A command line's comma-separated ``--weights``, each checked (``ConfigError``) before
    any model loads."""
    from pask_agent.errors import ConfigError
    from pask_agent.runtime.models.quantized_linear import check_weight_format

    formats = [w.strip() for w in str(text).split(",") if w.strip()]
    if not formats:
        raise ConfigError(f"--weights names no format; use {', '.join(WEIGHT_FORMATS)}")
    for w in formats:
        check_weight_format(w)
    return formats
