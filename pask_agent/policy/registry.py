"""Policies by name: one registry that the CLI, recipes, eval and tests all use (STYLE rule 4).

A policy module registers its class with ``@register_policy("snapkv")``; callers look it up with
:func:`get_policy`. The registry instance below is the only module-level mutable object in
``policy/``: it is filled at import time by the decorators and only read afterwards.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from pask_agent.errors import ConfigError

T = TypeVar("T")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class PolicyRegistry:
    """Maps policy names (lowercase identifiers such as ``"pask"``, ``"h2o"``) to policy classes."""

    def __init__(self) -> None:
        self._entries: dict[str, Any] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering a class under ``name``.

        Raises
        ------
        ConfigError
            ``name`` is not a lowercase identifier or is already taken.
        """
        if not _NAME.match(name):
            raise ConfigError(f"policy name {name!r} must be a lowercase identifier like 'snapkv'")

        def decorate(cls: T) -> T:
            if name in self._entries and self._entries[name] is not cls:
                raise ConfigError(
                    f"policy name {name!r} is already registered to {self._entries[name]!r}"
                )
            self._entries[name] = cls
            return cls

        return decorate

    def get(self, name: str) -> Any:
        """The class registered as ``name``.

        Raises
        ------
        ConfigError
            Unknown name; the message lists the valid ones.
        """
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self.names()) or "(none registered)"
            raise ConfigError(f"unknown policy {name!r}; valid policies: {valid}") from None

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries


POLICIES = PolicyRegistry()


def register_policy(name: str) -> Callable[[T], T]:
    """``@register_policy("snapkv")`` registers a policy class in :data:`POLICIES`."""
    return POLICIES.register(name)


def get_policy(name: str) -> Any:
    """Look a policy class up by name; an unknown name raises ``ConfigError`` listing valid ones."""
    return POLICIES.get(name)
