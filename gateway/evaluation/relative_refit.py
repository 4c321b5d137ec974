"""A learning refit of the relative verifier threshold's parameters (routing.verifier.relative: `pool`,
`refusal_spend`) from the loop's labels (the learning simulation's `--sim-relative labels`, and `selfroute learn`
on the ledger's labels, which writes the choice only when it holds out of fold: relative_out_of_fold).

train/calibrate choose them on paired answers (gateway.evaluation.relative_choice.choose_relative: every answer has both
routes' quality, each unit replayed in several stream orders, scored on issue 19's targets). The loop has less: labels
on its escalations and on a few weighted shadows, and one stream in the order it arrived, with a token budget. So
this replays the one stream and estimates each candidate's quality from the weighted labels.

Once a key's window is warm the relative rule, not the fixed thresholds, decides what escalates, so a refit that only
re-chooses the fixed thresholds changes nothing after the warm-up. Here every candidate (pool, refusal_spend) is
replayed by the live rule (gateway.routing.escalation.CheapAnswerCheck.verdict, a fresh window per key) over every
checked cheap answer in arrival order: what it escalates and the long tokens it spends need no labels. Its quality
is estimated on the labelled ones: an escalated answer is as good as the long route's, an accepted one stands on its
label; each label weighted as the refit weighs it (a shadow label 1 / its chance), so the labelled answers stand for
all of them. The best quality within the token budget wins; a candidate as good as the one in force at fewer tokens
wins too (a tie is a saving), and a change needs MIN_GAIN_POINTS otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.evaluation.refit import MIN_GAIN_POINTS, weighted_quality
from gateway.evaluation.relative_choice import with_relative as relative_settings
from gateway.routing.decision import RouteDecision
from gateway.routing.escalation import CheapAnswerCheck
from policies.schema import Policy

# the candidates: a coarse grid around the shipped (1.5, 0.9), each replayed over the whole stream at every refit
POOLS = (1.0, 1.5, 2.0, 3.0)  # x the window's refusal share
REFUSAL_SPENDS = (0.5, 0.9, 1.2, 1.6, 2.5)


@dataclass
class CheckedStream:
    """Every checked cheap answer, in arrival order, as the ledger records them (labelled or not)."""

    scores: list[float]  # the verifier in force's P(good)
    refused: list[bool]
    long_tokens: list[float]  # what its long leg sends (the relative rule's charge)
    decisions: list[RouteDecision]
    keys: list[str | None]  # the key that sent it (one window per key)


@dataclass
class RelativeCandidate:
    pool: float
    refusal_spend: float
    quality: float  # estimated on the labelled answers (points)
    token_share: float  # escalations' long tokens / all checked answers' long tokens


@dataclass
class RelativeRefit:
    chosen: RelativeCandidate
    in_force: RelativeCandidate
    changed: bool
    decision: str


def with_pool_and_spend(policy: Policy, pool: float, refusal_spend: float) -> Policy:
    """The policy with its relative rule's pool and refusal_spend replaced (its other settings kept)."""
    settings = policy.routing.verifier
    if settings is None or settings.relative is None:
        raise ValueError("the policy has no routing.verifier.relative")
    return relative_settings(
        policy, settings.relative.model_copy(update={"pool": float(pool), "refusal_spend": float(refusal_spend)})
    )


def relative_escalations(policy: Policy, stream: CheckedStream) -> list[bool]:
    """What the policy's relative rule escalates of the stream, by the live rule from empty windows."""
    check = CheapAnswerCheck(policy)
    return [
        check.verdict(d, bool(r), float(s), k, float(t)).escalate
        for s, r, t, d, k in zip(stream.scores, stream.refused, stream.long_tokens, stream.decisions, stream.keys)
    ]


def _escalations_and_share(
    policy: Policy, stream: CheckedStream, pool: float, spend: float
) -> tuple[list[bool], float]:
    """What (pool, spend) escalates of the stream, and its escalations' share of the stream's long tokens."""
    escalated = relative_escalations(with_pool_and_spend(policy, pool, spend), stream)
    total = sum(stream.long_tokens) or 1.0
    return escalated, sum(t for t, e in zip(stream.long_tokens, escalated) if e) / total


@dataclass
class _Replayed:
    """One (pool, refusal_spend) replayed over the whole stream: label-free, so the folds share it."""

    pool: float
    refusal_spend: float
    escalated: list[bool]
    token_share: float

    def scored(self, labelled: Sequence[int], labels: Sequence[int], weights: Sequence[float]) -> RelativeCandidate:
        quality = weighted_quality([self.escalated[i] for i in labelled], labels, weights)
        return RelativeCandidate(self.pool, self.refusal_spend, quality, self.token_share)


def _replay_grid(
    policy: Policy, stream: CheckedStream, pools: Sequence[float], spends: Sequence[float]
) -> tuple[_Replayed, list[_Replayed]]:
    """The one in force and every other candidate of the grid, each replayed once."""
    settings = policy.routing.verifier
    if settings is None or settings.relative is None:
        raise ValueError("the policy has no routing.verifier.relative")
    now = settings.relative

    def run(pool: float, spend: float) -> _Replayed:
        return _Replayed(pool, spend, *_escalations_and_share(policy, stream, pool, spend))

    others = [run(pool, spend) for pool in pools for spend in spends if (pool, spend) != (now.pool, now.refusal_spend)]
    return run(now.pool, now.refusal_spend), others


def _choose(
    replayed_in_force: _Replayed,
    replayed: Sequence[_Replayed],
    labelled: Sequence[int],
    labels: Sequence[int],
    weights: Sequence[float],
    max_token_share: float | None,
) -> RelativeRefit:
    in_force = replayed_in_force.scored(labelled, labels, weights)
    candidates = [r.scored(labelled, labels, weights) for r in replayed]
    budget = max_token_share if max_token_share is not None else float("inf")
    within = [c for c in candidates if c.token_share <= budget + 1e-9]
    over = in_force.token_share > budget + 1e-9
    if not within:
        cheapest = min([in_force, *candidates], key=lambda c: (c.token_share, -c.quality))
        changed = cheapest is not in_force
        return RelativeRefit(cheapest, in_force, changed, "no candidate within the token budget: the cheapest")
    best = max(within, key=lambda c: (c.quality, -c.token_share))
    if over:
        return RelativeRefit(best, in_force, True, "the one in force is over the token budget")
    if best.quality >= in_force.quality + MIN_GAIN_POINTS:
        return RelativeRefit(best, in_force, True, f"{best.quality - in_force.quality:+.2f} points on the labels")
    saving = [c for c in within if c.quality >= in_force.quality and c.token_share < in_force.token_share]
    if saving:
        cheaper = min(saving, key=lambda c: (c.token_share, -c.quality))
        return RelativeRefit(
            cheaper, in_force, True, f"as good on the labels at {cheaper.token_share:.1%} of the long tokens"
        )
    return RelativeRefit(in_force, in_force, False, "no candidate is better on the labels, nor as good for less")


def refit_relative(
    policy: Policy,
    stream: CheckedStream,
    labelled: Sequence[int],
    labels: Sequence[int],
    weights: Sequence[float],
    max_token_share: float | None = None,
    pools: Sequence[float] = POOLS,
    spends: Sequence[float] = REFUSAL_SPENDS,
) -> RelativeRefit:
    """The relative rule's (pool, refusal_spend) for this stream: `labelled` indexes the stream's labelled answers
    (`labels`: 1 good enough; `weights` as the refit weighs them); `max_token_share`: the escalations' long tokens at
    most this share of the stream's (None: no budget). The one in force stays unless a candidate within the budget
    beats it by MIN_GAIN_POINTS, or matches it at fewer tokens; when the one in force is over the budget, the best
    candidate within it (else the cheapest) replaces it."""
    in_force, others = _replay_grid(policy, stream, pools, spends)
    return _choose(in_force, others, labelled, labels, weights, max_token_share)


@dataclass
class RelativeOutOfFold:
    """`selfroute learn`'s check of a relative refit: the choice on all labels, and how the same choice made without
    each fold's documents did on that fold."""

    refit: RelativeRefit  # chosen on all the labels
    quality_in_force: float  # points, on all the labels
    quality_out_of_fold: float  # points: each labelled answer escalated as the choice made without its fold would
    folds: int
    write: bool
    decision: str


def relative_out_of_fold(
    policy: Policy,
    stream: CheckedStream,
    labelled: Sequence[int],
    labels: Sequence[int],
    weights: Sequence[float],
    groups: Sequence[str],
    max_token_share: float | None = None,
    *,
    folds: int = 5,
    seed: int = 0,
    pools: Sequence[float] = POOLS,
    spends: Sequence[float] = REFUSAL_SPENDS,
) -> RelativeOutOfFold:
    """refit_relative on all the labels, written (`write`) only when the choice holds out of fold: folds grouped by
    document (`groups`, one per labelled answer), each fold's answers decided by the candidate refit_relative picks
    from the other folds' labels. The in-sample pick gains by construction (it is the best of 20 on those labels);
    out of fold it must beat the one in force by MIN_GAIN_POINTS, or match it while the pick spends fewer tokens,
    or the one in force must be over the token budget."""
    from classifier.training import grouped_folds

    in_force, others = _replay_grid(policy, stream, pools, spends)
    full = _choose(in_force, others, labelled, labels, weights, max_token_share)
    quality_in_force = full.in_force.quality
    if not full.changed:
        return RelativeOutOfFold(full, quality_in_force, quality_in_force, 0, False, full.decision)
    if len(set(groups)) < 2:
        return RelativeOutOfFold(
            full, quality_in_force, quality_in_force, 0, False, f"kept: {full.decision}, but one document: no folds"
        )
    by_settings = {(r.pool, r.refusal_spend): r for r in (in_force, *others)}
    splits = grouped_folds(list(labels), list(groups), folds, seed)
    escalated = [False] * len(labelled)
    for train, test in splits:
        pick = _choose(
            in_force,
            others,
            [labelled[j] for j in train],
            [labels[j] for j in train],
            [weights[j] for j in train],
            max_token_share,
        ).chosen
        chosen = by_settings[(pick.pool, pick.refusal_spend)]
        for j in test:
            escalated[j] = chosen.escalated[labelled[j]]
    quality = weighted_quality(escalated, labels, weights)
    held = f"out of fold {quality:.2f} vs {quality_in_force:.2f} points in force"
    budget = max_token_share if max_token_share is not None else float("inf")
    if in_force.token_share > budget + 1e-9:
        write, decision = True, f"{full.decision} ({held})"
    elif quality >= quality_in_force + MIN_GAIN_POINTS:
        write, decision = True, f"{full.decision}; {held}"
    elif quality >= quality_in_force and full.chosen.token_share < full.in_force.token_share:
        write, decision = True, f"{full.decision}; {held}, at fewer tokens"
    else:
        write, decision = False, f"kept: {full.decision}, but {held}"
    return RelativeOutOfFold(full, quality_in_force, quality, len(splits), write, decision)


def relative_for_budget(
    policy: Policy,
    stream: CheckedStream,
    max_token_share: float,
    pools: Sequence[float] = POOLS,
    spends: Sequence[float] = REFUSAL_SPENDS,
) -> RelativeCandidate:
    """No labels: the (pool, refusal_spend) whose escalations come closest to `max_token_share` of the stream's long
    tokens without passing it (else the cheapest); the learning simulation's budget control, so what the learning
    router gains over it is the labels' and not the spend's. `quality` is not estimated (0)."""
    found = [
        RelativeCandidate(pool, spend, 0.0, _escalations_and_share(policy, stream, pool, spend)[1])
        for pool in pools
        for spend in spends
    ]
    within = [c for c in found if c.token_share <= max_token_share + 1e-9]
    if within:
        return max(within, key=lambda c: c.token_share)
    return min(found, key=lambda c: c.token_share)
