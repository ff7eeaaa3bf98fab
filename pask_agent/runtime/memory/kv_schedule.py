"""Deferred actions: what each token becomes when it leaves the recent window (App. B.2, B.6).

A policy decides a token's per-group action when the token is planned (prompt) or sampled
(decode), but the store carries it out only once the token is older than the recent window:
until then every token reads at full precision. This is the one place those decisions wait.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pask_agent.policy.actions import Action

Actions = tuple[Action, ...]
KEEP: Actions = (Action.H, Action.H, Action.H)


class ActionSchedule:
    """One sequence's scheduled actions by absolute position; unscheduled tokens stay high."""

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due: dict[int, Actions] = {}

    def put(self, position: int, actions: Sequence[Action]) -> None:
        self._due[position] = tuple(actions)

    def peek(self, position: int) -> Actions:
        return self._due.get(position, KEEP)

    def take(self, position: int) -> Actions:
        """The token's actions, forgotten once carried out (``KEEP`` when none were set)."""
        return self._due.pop(position, KEEP)

    def take_range(self, start: int, stop: int) -> Iterator[tuple[int, Actions]]:
        for p in range(start, stop):
            yield p, self._due.pop(p, KEEP)

    def settle_on_write(
        self, length: int, n: int, sinks: int, window: int
    ) -> list[tuple[int, Actions]]:
        """Tokens of a chunk of ``n`` written at ``length`` that are already past the window
        when the chunk's step ends: their offsets in the chunk and actions (sinks stay high).
        Only those entries are read, so a decode chunk, still inside the window, costs nothing.
        """
        return [(p - length, self.take(p)) for p in range(max(length, sinks), length + n - window)]

    def due_after_step(
        self, settled: int, length: int, n: int, sinks: int, window: int
    ) -> tuple[list[tuple[int, Actions]], int]:
        """Older tokens (written before this step's ``n``) that left the window in it, with
        their actions, and the new settled mark (``length`` counts this step's tokens)."""
        start, stop = max(settled, sinks), length - window
        if stop <= start:
            return [], settled
        return list(self.take_range(start, min(stop, length - n))), stop

    def copy(self) -> ActionSchedule:
        twin = ActionSchedule()
        twin._due = dict(self._due)
        return twin

    def drop_from(self, length: int) -> None:
        """Forget the actions of positions >= ``length`` (a truncated conversation)."""
        for p in [p for p in self._due if p >= length]:
            del self._due[p]
