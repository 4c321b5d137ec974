"""The recent checked cheap answers of one deployment (one policy, one key), for a verifier threshold relative to its
own traffic (policies.schema.RelativeThreshold; the rule itself is gateway.routing.escalation's).

A verifier's P(good) ranks cheap answers on corpora and models it never saw, but not on one scale: one fixed
threshold escalates 6% of one corpus and none of another (BENCHMARKS.md section 4). So the rule reads the key's own
last answers: how many of them refused (what Self-Route would have escalated, and the long tokens it would have
spent) and where this answer's P(good) falls among theirs. Label-free, causal: an answer is decided only from the
answers before it. Each key has its own window, so one key's traffic never moves another key's escalations.
A window starts from the key's recorded answers in the ledger (`history`), so a restart or a second worker does
not start cold.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from policies.schema import RelativeThreshold

MAX_KEYS = 10_000  # windows kept in memory; the least recently used key's is dropped (and reloaded from the ledger)


@dataclass(frozen=True)
class Seen:
    """One checked cheap answer as the window keeps it."""

    score: float  # the verifier's P(good)
    refused: bool  # the answer said the passages lack the answer (Self-Route would have escalated it)
    long_tokens: float  # what its long leg sends (or would have sent)
    escalated: bool
    probability: float | None = None  # the pre-route P(cheap) (ranked by with RelativeThreshold.cheap_weight)


def rank(settings: RelativeThreshold, score: float, probability: float | None, long_tokens: float) -> float:
    """Where an answer stands in its window (lowest: escalated first): its P(good), mixed with the pre-route P(cheap)
    by `cheap_weight`, and with `per_token` its doubt per long token, negated (a doubted answer that is cheap to send
    long goes first). In [0, 1], or [-1, 0] with per_token (long legs of at least one token)."""
    value = score
    if settings.cheap_weight and probability is not None:
        value = (1.0 - settings.cheap_weight) * score + settings.cheap_weight * probability
    if settings.per_token:
        value = -(1.0 - value) / max(float(long_tokens), 1.0)
    return value


def rank_bounds(settings: RelativeThreshold) -> tuple[float, float]:
    """Thresholds that no rank / every rank falls below."""
    return (-1.0, 1e-9) if settings.per_token else (0.0, 1.0 + 1e-9)


@dataclass(frozen=True)
class InForce:
    """What the relative rule allows for the next answer."""

    threshold: float  # escalate below this rank (rank(): P(good) unless the settings mix in more) ...
    budget_tokens: float  # ... while its long leg fits in this many tokens (the window's refusals' spend, less spent)


class ScoreWindow:
    """The last `settings.window` checked answers of one key. Thread-safe: `lock` is held by the caller across
    `in_force` and `add` so concurrent requests of a key see each other's decisions in some order."""

    def __init__(self, settings: RelativeThreshold, history: Iterable[Seen] = ()):
        self.settings = settings
        self.lock = threading.RLock()
        self._seen: deque[Seen] = deque()
        self._sorted: list[float] = []
        self._refused = 0
        self._refusal_tokens = 0.0
        self._long_tokens = 0.0
        self._spent_tokens = 0.0
        for seen in history:
            self.add(seen)

    def __len__(self) -> int:
        return len(self._seen)

    def in_force(self) -> InForce | None:
        """The threshold and token budget for the next answer; None while the window holds fewer than warm_up."""
        with self.lock:
            n = len(self._seen)
            if n < self.settings.warm_up:
                return None
            settings = self.settings
            share = min(1.0, max(settings.min_share, settings.pool * self._refused / n))
            at = int(share * n)
            # the rank below which about `share` of the window's answers fall; none when the share rounds to 0
            low, high = rank_bounds(settings)
            threshold = low if at == 0 else (self._sorted[at] if at < n else high)
            allowed = (
                settings.long_share * self._long_tokens
                if settings.long_share is not None
                else settings.refusal_spend * self._refusal_tokens
            )
            return InForce(threshold, allowed - self._spent_tokens)

    def add(self, seen: Seen) -> None:
        with self.lock:
            self._seen.append(seen)
            bisect.insort(self._sorted, self.rank(seen))
            self._count(seen, 1)
            while len(self._seen) > self.settings.window:
                old = self._seen.popleft()
                del self._sorted[bisect.bisect_left(self._sorted, self.rank(old))]
                self._count(old, -1)

    def rank(self, seen: Seen) -> float:
        return rank(self.settings, seen.score, seen.probability, seen.long_tokens)

    def _count(self, seen: Seen, sign: int) -> None:
        self._refused += sign * int(seen.refused)
        self._refusal_tokens += sign * seen.long_tokens * seen.refused
        self._long_tokens += sign * seen.long_tokens
        self._spent_tokens += sign * seen.long_tokens * seen.escalated


# a key's recorded answers, oldest first (at most `limit`): gateway.ledger.labels.recent_answers, bound by start-up
History = Callable[[str | None, int], list[Seen]]


class ScoreWindows:
    """One window per key (None: the open gateway's callers, together), created on a key's first answer from
    `history` (the ledger), else empty."""

    def __init__(self, settings: RelativeThreshold, history: History | None = None, max_keys: int = MAX_KEYS):
        self.settings = settings
        self.history = history
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._windows: OrderedDict[str | None, ScoreWindow] = OrderedDict()

    def window(self, key: str | None) -> ScoreWindow:
        with self._lock:
            found = self._windows.get(key)
            if found is not None:
                self._windows.move_to_end(key)
                return found
        # read the ledger outside the registry's lock (other keys' requests go on meanwhile)
        seen = self.history(key, self.settings.window) if self.history is not None else []
        with self._lock:
            found = self._windows.get(key)
            if found is None:
                found = self._windows[key] = ScoreWindow(self.settings, seen)
                while len(self._windows) > self.max_keys:
                    self._windows.popitem(last=False)
            return found
