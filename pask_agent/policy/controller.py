"""The online decode controller: tag × layer group → scheduled action (paper §3.5, App. B.6, B.7).

For each accepted token the controller

1. looks the tag up with parent fallback ``(c,r,s,n) → (c,r,s) → (c,r) → c`` (then the table's
   fallback map, then the table default), giving per layer group a base action ``a0``, a floor
   ``a⁻`` and adjacent-move scores;
2. starts from ``a = max(a0, a⁻)`` so the floor always holds (App. E.1);
3. opens the token in the ledger, so the balance is ``R_t = t·b − Σ_{i<t} M(a_i)``, and holds
   back the reserve: ``B_t = [R_t − Γ(s_t; B_D)]_+`` may be spent;
4. if ``M(a) > B_t`` demotes (H→L, L→R) lowest stored downgrade score first, never below a
   floor, until it fits or only floors remain; otherwise promotes (R→L, L→H) highest stored
   upgrade score first while each promotion still fits. Ties follow the table's serialized tie
   order. Each group moves at most two adjacent steps, in one direction;
5. charges ``M(a)``. Floors that cost more than ``R_t`` leave debt that carries forward.

The actions are *scheduled*: the runtime executes a token's action when the token leaves the
recent window. Work and state per token are ``O(|C| log |C|)`` and ``O(|C|)``, independent of
history (App. E.3); the undo log for :meth:`DecodeController.rollback` is a fixed-size ring.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from itertools import product
from types import MappingProxyType
from typing import TYPE_CHECKING

from pask_agent.errors import ConfigError
from pask_agent.grammars.tags import VOCABULARIES, Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.ledger import BudgetLedger, as_fraction
from pask_agent.policy.reserve import ReserveBytes
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import MOVES, NUM_GROUPS, DecodeEntry, tie_key

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pask_agent.policy.costs import PayloadCosts

_ACTIONS = (Action.R, Action.L, Action.H)
DEFAULT_KEY = "<default>"
STOP_KEY = "<stop>"

# A move's rank key: smaller sorts first. (−score, tie rank) for promotions, (score, tie rank)
# for demotions; None where the move does not exist (promoting H, demoting R).
_RankKey = tuple[float, int] | None


@dataclass(frozen=True, slots=True)
class GroupRule:
    """One layer group of a resolved bucket, with rank keys precomputed per current action."""

    start: int  # max(base, floor)
    floor: int
    up_key: tuple[_RankKey, _RankKey, _RankKey]  # indexed by the current action
    down_key: tuple[_RankKey, _RankKey, _RankKey]


@dataclass(frozen=True, slots=True)
class Bucket:
    """A resolved decode bucket: the table key that matched and one rule per layer group."""

    key: str
    rules: tuple[GroupRule, ...]


def compile_bucket(key: str, entries: list[DecodeEntry], tie_rank: Mapping[str, int]) -> Bucket:
    rules = []
    for c, entry in enumerate(entries):
        base, floor = Action.parse(entry.base), Action.parse(entry.floor)
        rank = {move: tie_rank[tie_key(c, move)] for move in MOVES}
        up_rl = (-entry.upgrade["R->L"], rank["R->L"])
        up_lh = (-entry.upgrade["L->H"], rank["L->H"])
        down_lr = (entry.downgrade["L->R"], rank["L->R"])
        down_hl = (entry.downgrade["H->L"], rank["H->L"])
        # Indexed by the current action R, L, H.
        rules.append(
            GroupRule(
                start=int(max(base, floor)),
                floor=int(floor),
                up_key=(up_rl, up_lh, None),
                down_key=(None, down_lr, down_hl),
            )
        )
    return Bucket(key, tuple(rules))


@dataclass(frozen=True, slots=True)
class DecodeLookup:
    """Constant-time ``Tag → Bucket``: every tag of the table's vocabularies is resolved once."""

    by_tag: Mapping[Tag, Bucket]
    by_key: Mapping[str, Bucket]
    default: Bucket

    @classmethod
    def from_table(cls, table: PolicyTable) -> DecodeLookup:
        tie_rank = {name: i for i, name in enumerate(table.tie_order)}
        by_key = {k: compile_bucket(k, v, tie_rank) for k, v in table.decode.items()}
        for k, target in table.decode_fallback.items():
            by_key.setdefault(k, by_key[target])
        default = compile_bucket(DEFAULT_KEY, table.decode_default, tie_rank)
        lookup = cls(MappingProxyType({}), MappingProxyType(by_key), default)
        by_tag = {}
        for family in table.families:
            vocab = VOCABULARIES[family]
            for fields in product(vocab["cls"], vocab["role"], vocab["state"], vocab["next"]):
                tag = Tag(*fields)
                by_tag[tag] = lookup.resolve(tag)
        return cls(MappingProxyType(by_tag), MappingProxyType(by_key), default)

    def resolve_all(self, tags: Sequence[Tag | None]) -> Bucket:
        """Conservative bucket for a token that carries several candidate tags (App. A.1).

        Per layer group the larger start action and floor win; promotions rank by the highest
        and demotions by the highest (last-demoted) score among the candidates.
        """
        buckets = [self.resolve(t) for t in tags]
        if len(buckets) == 1:
            return buckets[0]
        rules = []
        for group_rules in zip(*(b.rules for b in buckets), strict=True):
            rules.append(
                GroupRule(
                    start=max(r.start for r in group_rules),
                    floor=max(r.floor for r in group_rules),
                    up_key=tuple(_pick(min, [r.up_key[a] for r in group_rules]) for a in range(3)),
                    down_key=tuple(
                        _pick(max, [r.down_key[a] for r in group_rules]) for a in range(3)
                    ),
                )
            )
        return Bucket("|".join(b.key for b in buckets), tuple(rules))

    def resolve(self, tag: Tag | None) -> Bucket:
        """Most specific bucket for ``tag``; untagged tokens get the table default."""
        if tag is None:
            return self.default
        hit = self.by_tag.get(tag)
        if hit is not None:
            return hit
        for key in tag.parents():
            hit = self.by_key.get(key)
            if hit is not None:
                return hit
        return self.default


def _pick(choose: Callable[..., _RankKey], keys: list[_RankKey]) -> _RankKey:
    present = [k for k in keys if k is not None]
    return choose(present) if present else None


@dataclass(frozen=True, slots=True)
class TokenDecision:
    """The scheduled actions for one token (executed when it leaves the recent window).

    Attributes
    ----------
    index:
        0-based index among generated tokens that have KV (a stop token gets the next index
        but does not consume it).
    actions, floors:
        One action and one floor per layer group (lower, middle, upper); ``actions ≥ floors``.
    payload_bytes:
        ``M(a_t)`` charged for this token (0 for a stop token).
    balance_after:
        Ledger balance after the charge, in bytes (negative: debt carried forward).
    reserve_bytes:
        ``Γ(s_t; B_D)`` held back when deciding this token.
    bucket:
        The table key that matched (``"<default>"`` or ``"<stop>"`` for those cases).
    """

    index: int
    actions: tuple[Action, ...]
    floors: tuple[Action, ...]
    payload_bytes: int
    balance_after: Fraction
    reserve_bytes: Fraction
    bucket: str
    is_stop: bool = False


class DecodeController:
    """Per-request PASK decode control over a shared frozen table.

    Parameters
    ----------
    table:
        The frozen policy; only its decode side, reserve and window are used here.
    costs:
        Payload costs of the model being served (3 layer groups).
    budget:
        Decode stage budget ``B_D`` in ``[0, 1]``; defaults to ``table.budget_decode``.
    ledger:
        Ledger to continue from (e.g. a conversation's); its ``B_D`` then applies. A fresh one
        by default.
    lookup:
        A precompiled :class:`DecodeLookup` to share between requests; compiled if omitted.
    max_rollback:
        How many of the latest tokens :meth:`rollback` can undo (the undo ring's size).

    Raises
    ------
    ConfigError
        Budget outside ``[0, 1]`` or disagreeing with ``ledger``, a cost model without 3 groups,
        or ``max_rollback < 0``.
    """

    def __init__(
        self,
        table: PolicyTable,
        costs: PayloadCosts,
        *,
        budget: float | Fraction | None = None,
        ledger: BudgetLedger | None = None,
        lookup: DecodeLookup | None = None,
        max_rollback: int = 64,
    ) -> None:
        if costs.num_groups != NUM_GROUPS:
            raise ConfigError(f"cost model has {costs.num_groups} groups, expected {NUM_GROUPS}")
        if max_rollback < 0:
            raise ConfigError(f"max_rollback={max_rollback} must be >= 0")
        full = costs.full_bytes_per_token
        if ledger is None:
            b_d = as_fraction(table.budget_decode if budget is None else budget, name="budget")
            ledger = BudgetLedger.start(budget=b_d, full_bytes_per_token=full)
        else:
            if ledger.full_bytes_per_token != full:
                raise ConfigError(
                    f"ledger counts C_full={ledger.full_bytes_per_token} bytes but this model's "
                    f"C_full is {full}: a ledger cannot move between models"
                )
            b_d = ledger.allowance_per_token / full
            if budget is not None and as_fraction(budget, name="budget") != b_d:
                raise ConfigError(f"budget={budget} differs from the given ledger's B_D={b_d}")
        self._ledger = ledger
        self._lookup = lookup or DecodeLookup.from_table(table)
        self._reserve = ReserveBytes.resolve(table.reserve, budget=b_d, full_bytes_per_token=full)
        self._bytes = costs.bytes_by_group
        self._window = table.window_tokens
        # Enough entries to undo max_rollback tokens and still know the window's pending
        # decisions (+1 for a stop token at the end).
        self._log: deque[tuple[BudgetLedger, TokenDecision]] = deque(
            maxlen=max_rollback + self._window + 1
        )
        self._max_rollback = max_rollback

    @property
    def ledger(self) -> BudgetLedger:
        """The current (immutable) ledger value; keep it to snapshot the budget."""
        return self._ledger

    @property
    def reserve(self) -> ReserveBytes:
        return self._reserve

    def on_token(
        self, tag: Tag | None, *, is_stop: bool = False, candidates: Sequence[Tag] = ()
    ) -> TokenDecision:
        """Decide and charge one accepted token; ``tag`` is None for untagged tokens.

        ``candidates`` are further tags of a token that spans a structural boundary; their
        buckets combine conservatively with ``tag``'s and the largest reserve applies.
        """
        before = self._ledger
        if is_stop:
            # Stop tokens never get KV: no allowance, no charge (App. B.7).
            none = (Action.R,) * NUM_GROUPS
            decision = TokenDecision(
                before.tokens, none, none, 0, before.balance, Fraction(0), STOP_KEY, True
            )
            self._log.append((before, decision))
            return decision
        if candidates:
            bucket = self._lookup.resolve_all((tag, *candidates))
        else:
            bucket = self._lookup.resolve(tag)
        rules = bucket.rules
        ledger = before.open_token()
        reserve = self._reserve.for_state(None if tag is None else tag.state)
        for extra in candidates:
            reserve = max(reserve, self._reserve.for_state(extra.state))
        spendable = ledger.balance - reserve
        if spendable < 0:
            spendable = Fraction(0)
        acts = [rule.start for rule in rules]
        total = sum(self._bytes[c][a] for c, a in enumerate(acts))
        if total > spendable:
            total = self._demote(acts, rules, total, spendable)
        else:
            total = self._promote(acts, rules, total, spendable)
        self._ledger = ledger.charge(total)
        decision = TokenDecision(
            before.tokens,
            tuple(_ACTIONS[a] for a in acts),
            tuple(_ACTIONS[rule.floor] for rule in rules),
            total,
            self._ledger.balance,
            reserve,
            bucket.key,
        )
        self._log.append((before, decision))
        return decision

    def _promote(
        self, acts: list[int], rules: tuple[GroupRule, ...], total: int, spendable: Fraction
    ) -> int:
        blocked = [False] * len(acts)
        while True:
            best = -1
            best_key: tuple[float, int] | None = None
            for c, rule in enumerate(rules):
                key = rule.up_key[acts[c]]
                if key is not None and not blocked[c] and (best_key is None or key < best_key):
                    best, best_key = c, key
            if best < 0:
                return total
            delta = self._bytes[best][acts[best] + 1] - self._bytes[best][acts[best]]
            if total + delta <= spendable:
                acts[best] += 1
                total += delta
            else:
                blocked[best] = True  # its next step needs this one first

    def _demote(
        self, acts: list[int], rules: tuple[GroupRule, ...], total: int, spendable: Fraction
    ) -> int:
        while total > spendable:
            best = -1
            best_key: tuple[float, int] | None = None
            for c, rule in enumerate(rules):
                key = rule.down_key[acts[c]]
                if (
                    acts[c] > rule.floor
                    and key is not None
                    and (best_key is None or key < best_key)
                ):
                    best, best_key = c, key
            if best < 0:
                break  # only floors left: the excess becomes debt
            total -= self._bytes[best][acts[best]] - self._bytes[best][acts[best] - 1]
            acts[best] -= 1
        return total

    def pending(self) -> tuple[TokenDecision, ...]:
        """Decisions of tokens still inside the recent window (not yet executed), oldest first."""
        first = self._ledger.tokens - self._window
        out = [d for _, d in self._log if not d.is_stop and d.index >= first]
        return tuple(out)

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` :meth:`on_token` calls: ledger, decisions and pending actions.

        Raises
        ------
        ConfigError
            ``n`` is negative or more than the undo ring holds (``max_rollback``).
        """
        kept = min(len(self._log), self._max_rollback)
        if not 0 <= n <= kept:
            raise ConfigError(
                f"cannot roll back {n} tokens: only the last {kept} are kept; create the "
                "controller with a larger max_rollback"
            )
        if n == 0:
            return
        for _ in range(n - 1):
            self._log.pop()
        self._ledger = self._log.pop()[0]
