"""Multi-turn conversations: turns share one store sequence (prefix reuse) and one policy
session (the budget ledger), and the options a turn takes.

Kept apart from ``runtime.py``: a conversation is a handle users hold across turns, while the
runtime owns the worker and the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pask_agent.errors import ConfigError
from pask_agent.runtime.requests import SequenceState

if TYPE_CHECKING:
    from pask_agent.runtime.runtime import Runtime


class Conversation:
    """Turns of one conversation share one store sequence and one policy session (ledger)."""

    def __init__(self, conversation_id: str, *, owner: Runtime | None = None) -> None:
        self.id = conversation_id
        self._owner = owner  # its KV lives in this runtime's store, for this runtime's model
        self._state: SequenceState | None = None

    def _acquire(self, rt: Runtime, session: Any) -> SequenceState:
        if self._owner is None:
            self._owner = rt
        if self._owner is not rt:
            raise ConfigError(
                f"conversation {self.id!r} belongs to another runtime (model "
                f"{self._owner.engine.loaded.name!r}); its KV cannot move to this one (model "
                f"{rt.engine.loaded.name!r}): use this runtime's rt.conversation(id)"
            )
        if self._state is None:
            self._state = rt.engine.new_sequence(session)
        if self._state.busy:
            raise ConfigError(f"conversation {self.id!r} already has a turn running")
        self._state.busy = True
        return self._state

    @property
    def busy(self) -> bool:
        """True while one of this conversation's turns is running."""
        return self._state is not None and self._state.busy

    @property
    def tokens_in_store(self) -> int:
        return len(self._state.ids_in_store) if self._state else 0
