"""The check of the cheap answer, written once: after the cheap model answered, keep its answer or escalate.

Two rules, chosen by the policy:
- without a verifier (routing.verifier: null): Self-Route's literal rule, an answer that says it is
  unanswerable goes to the long route (unless the keep-refusal option lets it stand);
- with a verifier: a learned model (classifier.verifier) scores P(the cheap answer is good enough) from
  the question, the cheap answer, the passages sent, the document and the pre-route P(cheap)
  (classifier.answer_features); below the threshold the answer is escalated. A refusal still escalates by
  Self-Route's rule unless its P(good) reaches the refusal threshold (routing.verifier.refusal_threshold:
  "the documents do not say" can be the right answer, LaRA's hallu task); null leaves refusals to the
  threshold alone.
  With routing.verifier.relative, the threshold is relative to the key's own recent traffic
  (gateway.routing.score_window): once the key's window is warm, a cheap answer escalates when its P(good) is among
  the window's lowest (pool x the window's refusal share) and its long leg fits in refusal_spend x the long tokens
  Self-Route's rule would have spent on the window's refusals; the fixed thresholds decide until then. Its variants
  (policies.schema.RelativeThreshold: long_share, min_share, cheap_weight, per_token) change the budget, the share of
  candidates and what answers are ranked by (gateway.routing.score_window.rank).

The live path (plain and streaming, rag and direct answers) and the offline replay
(gateway.evaluation.replay) all call `CheapAnswerCheck.verdict`, so the replay measures exactly the rule
the gateway applies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.routing.decision import VERSION_CHARS, RouteDecision, missing
from gateway.routing.score_window import History, InForce, ScoreWindows, Seen, rank
from pipelines.unanswerable import UnanswerableDetector
from policies.routes import DIRECT, FALLBACK, KEPT_REFUSAL, RAG
from policies.schema import FallbackSettings, Policy

if TYPE_CHECKING:
    from classifier.verifier import VerifierModel

REFUSAL_KEPT = "refusal kept: evidence says the answer is absent"
ESCALATED = "cheap answer was unanswerable, fell back to long"
# the routes whose answer comes from the cheap model, and so is checked
CHECKED_ROUTES = (RAG, DIRECT)

# (content terms, term bigrams, numbers) of a document: classifier.answer_features.document_index
DocumentIndex = tuple[set, set, set]


@dataclass(frozen=True)
class Verdict:
    escalate: bool  # answer again on the long route
    outcome: str  # the decision's route (answer accepted), KEPT_REFUSAL (a refusal let stand) or FALLBACK
    note: str | None = None  # appended to the decision's reason
    score: float | None = None  # the verifier's P(good), when it scored the answer
    # what the live check read (kept with the request for learning: gateway.routing.learning.features_record)
    features: dict[str, float] | None = field(default=None, compare=False)
    refused: bool | None = None  # the answer said the passages lack the answer
    threshold: float | None = None  # the verifier threshold this answer was decided with (relative: the key's own)
    long_tokens: float | None = None  # the long leg's tokens the relative rule charged (None: it did not apply)

    def reason(self, decision: RouteDecision) -> str:
        return f"{decision.reason}; {self.note}" if self.note else decision.reason


@dataclass(frozen=True)
class CheapAnswer:
    """What the verifier reads about one cheap answer."""

    text: str | None  # the whole reply
    query: str = ""  # the question as the cheap model saw it (multiple-choice options included)
    passages: Sequence[str] = ()  # the passages placed in the prompt (direct: the context sent)
    document: DocumentIndex | None = None  # the whole document's index; None when unavailable (a collection)
    logprobs: list[float] | None = None
    # the retrieval pass that chose the passages (gateway.routing.answer_support.retrieval_inputs), if any
    retrieval: dict[str, float] | None = None
    # texts -> normalised vectors (the gateway's embedding model), for the answer's support in the passages
    embed: Callable[[list[str]], Any] | None = None
    # -> the vectors of the chunks sent, as the store holds them (gateway.routing.answer_support.sent_chunk_vectors),
    # read only when the verifier needs the support; None: the passages' texts are embedded
    passage_vectors: Callable[[], Any] | None = None


class CheapAnswerCheck:
    """The policy's check of cheap answers, with its verifier loaded once (gateway.routing.model_files)."""

    def __init__(
        self,
        policy: Policy,
        verifier: VerifierModel | None = None,
        history: History | None = None,
        windows: ScoreWindows | None = None,
    ):
        """`history`: a key's recorded answers (the ledger), for a relative threshold's first window of a key;
        `windows`: the windows of the check this one replaces (a reload, a refit), kept when the relative settings
        are the same."""
        self.policy = policy
        self.verifier = verifier if policy.routing.verifier is not None else None
        self.detector = UnanswerableDetector(policy.rag.unanswerable_patterns)
        relative = policy.routing.verifier.relative if policy.routing.verifier is not None else None
        # per key: one key's traffic never moves another's threshold
        self.windows = (
            None
            if relative is None
            else windows
            if windows is not None and windows.settings == relative
            else ScoreWindows(relative, history)
        )

    @property
    def threshold(self) -> float | None:
        """Escalate when P(good) < this; the policy's value, else the verifier card's."""
        settings = self.policy.routing.verifier
        if settings is None:
            return None
        if settings.threshold is not None:
            return settings.threshold
        return self.verifier.threshold if self.verifier is not None else None

    @property
    def model_version(self) -> str | None:
        """The verifier's version as the ledger records it: the first 16 hex of its skops file's sha256."""
        if self.verifier is None or self.verifier.sha256 is None:
            return None
        return self.verifier.sha256[:VERSION_CHARS]

    @property
    def refusal_threshold(self) -> float | None:
        """A refusal escalates when P(good) < this (None: only the threshold applies to refusals)."""
        settings = self.policy.routing.verifier
        return settings.refusal_threshold if settings is not None else None

    @property
    def can_escalate(self) -> bool:
        """Whether any cheap answer can be escalated under this policy: not with the fallback off, nor with a
        verifier whose thresholds no P(good) in [0, 1] falls below (0.0 and refusals left to it)."""
        if not self.policy.routing.fallback.enabled:
            return False
        if self.policy.routing.verifier is None or self.verifier is None:
            return True  # the literal rule escalates refusals
        return any(t is not None and t > 0.0 for t in (self.threshold, self.refusal_threshold))

    def holds(self, decision: RouteDecision, has_document: bool = True) -> bool:
        """Whether a streamed cheap answer is held back for the check: only when it applies and could escalate
        (a check that cannot escalate would only delay the stream)."""
        return self.can_escalate and self.applies(decision, has_document)

    @property
    def needs_embeddings(self) -> bool:
        """The verifier reads the answer's embedding-space support (classifier.answer_features.SUPPORT_FEATURES)."""
        from classifier.answer_features import SUPPORT_FEATURES

        return self.verifier is not None and bool(set(self.verifier.feature_names) & set(SUPPORT_FEATURES))

    @property
    def reads_whole_answer(self) -> bool:
        """The verifier reads the whole answer, so a stream is held until it ends; the literal rule reads
        only the opening (pipelines.unanswerable)."""
        return self.verifier is not None

    def applies(self, decision: RouteDecision, has_document: bool = True) -> bool:
        """Whether the cheap answer of this decision is checked at all (it is held back while streaming if so).
        A plain chat with no document (the conversation is only the question) is not: there is nothing the
        answer could be grounded in, and nothing a long read would add."""
        return decision.route in CHECKED_ROUTES and self.policy.routing.fallback.enabled and has_document

    @staticmethod
    def features(
        answer: CheapAnswer, pre_route_probability: float | None, with_support: bool = True
    ) -> dict[str, float]:
        """The verifier's inputs (classifier.answer_features), computed the same way live and in the replay.
        with_support: embed the answer and passages (when the answer carries an embedding function)."""
        from classifier.answer_features import answer_features
        from gateway.routing.answer_support import answer_support

        terms, bigrams, numbers = answer.document if answer.document is not None else (None, None, None)
        support = (
            answer_support(
                answer.query,
                answer.text,
                answer.passages,
                answer.embed,
                answer.passage_vectors() if answer.passage_vectors is not None else None,
            )
            if with_support and answer.embed is not None
            else None
        )
        return answer_features(
            answer.query,
            answer.text,
            list(answer.passages),
            None,
            answer.logprobs,
            pre_route_probability,
            retrieval=answer.retrieval,
            support=support,
            document_terms_set=terms,
            document_bigrams=bigrams,
            document_numbers=numbers,
        )

    def score(self, answer: CheapAnswer, pre_route_probability: float | None = None) -> float | None:
        """The verifier's P(the cheap answer is good enough); None without a verifier."""
        if self.verifier is None:
            return None
        return self.verifier.score(self.features(answer, pre_route_probability, self.needs_embeddings))

    def check(
        self, decision: RouteDecision, answer: CheapAnswer, key: str | None = None, long_tokens: float | None = None
    ) -> Verdict:
        """The live path: refusal cue and verifier score of this answer, then `verdict`."""
        if not self.applies(decision):
            return Verdict(False, decision.route)
        features = self.features(answer, decision.probability) if self.verifier is not None else None
        score = self.verifier.score(features) if self.verifier is not None and features is not None else None
        refused = self.detector.is_unanswerable(answer.text)
        return replace(self.verdict(decision, refused, score, key, long_tokens), features=features, refused=refused)

    def verdict(
        self,
        decision: RouteDecision,
        refused: bool,
        score: float | None,
        key: str | None = None,
        long_tokens: float | None = None,
    ) -> Verdict:
        """The rule itself. `refused`: the answer says the passages lack the answer; `score`: the verifier's
        P(good), or None for the literal rule. The replay calls this with recorded answers' values.
        With the relative rule (routing.verifier.relative), `key` picks the deployment's window and `long_tokens`
        is what this answer's long leg sends; the answer joins the window once decided, so answers must come in
        the order they arrived. Without long_tokens the fixed thresholds decide and the window is left alone."""
        if not self.applies(decision):
            return Verdict(False, decision.route)
        threshold = self.threshold
        if score is None or threshold is None:
            if not refused:
                return Verdict(False, decision.route)
            if keep_refusal(self.policy.routing.fallback, decision):
                return Verdict(False, KEPT_REFUSAL, REFUSAL_KEPT)
            return Verdict(True, FALLBACK, ESCALATED)
        if self.windows is None or long_tokens is None:
            return self._fixed(decision, refused, score, threshold)
        window = self.windows.window(key)
        with window.lock:  # decide and remember atomically: concurrent answers of a key see each other in order
            rule = window.in_force()
            found = (
                self._fixed(decision, refused, score, threshold)
                if rule is None
                else self._relative(decision, refused, score, rule, long_tokens)
            )
            window.add(Seen(float(score), bool(refused), float(long_tokens), found.escalate, decision.probability))
        return replace(found, long_tokens=float(long_tokens))

    def _relative(
        self, decision: RouteDecision, refused: bool, score: float, rule: InForce, long_tokens: float
    ) -> Verdict:
        t = rule.threshold
        assert self.windows is not None  # the relative rule runs only with its windows
        settings = self.windows.settings
        at = rank(settings, score, decision.probability, long_tokens)
        # the rank compared, when the settings rank by more than P(good)
        shown = f"P(good)={score:.2f}" + ("" if at == score else f", rank {at:.3g}")
        t_shown = f"{t:.3g}" if settings.per_token else f"{t:.2f}"  # per-token ranks are small numbers
        if at < t and long_tokens <= rule.budget_tokens:
            return Verdict(
                True,
                FALLBACK,
                f"verifier: {shown} < {t_shown} (this key's recent answers), escalated to long",
                score,
                threshold=t,
            )
        if refused:
            return Verdict(
                False, KEPT_REFUSAL, f"verifier: refusal kept ({shown}, relative {t_shown})", score, threshold=t
            )
        return Verdict(False, decision.route, f"verifier: {shown}, relative threshold {t_shown}", score, threshold=t)

    def _fixed(self, decision: RouteDecision, refused: bool, score: float, threshold: float) -> Verdict:
        """The policy's fixed thresholds (and the relative rule's warm-up)."""
        found = self._fixed_verdict(decision, refused, score, threshold)
        return replace(found, threshold=threshold)

    def _fixed_verdict(self, decision: RouteDecision, refused: bool, score: float, threshold: float) -> Verdict:
        if score < threshold:
            return Verdict(True, FALLBACK, f"verifier: P(good)={score:.2f} < {threshold:.2f}, escalated to long", score)
        refusal_threshold = self.refusal_threshold
        if refused and refusal_threshold is not None and score < refusal_threshold:
            if keep_refusal(self.policy.routing.fallback, decision):
                return Verdict(False, KEPT_REFUSAL, REFUSAL_KEPT, score)
            return Verdict(
                True,
                FALLBACK,
                f"verifier: refusal with P(good)={score:.2f} < {refusal_threshold:.2f}, escalated to long",
                score,
            )
        if refused:
            return Verdict(
                False, KEPT_REFUSAL, f"verifier: P(good)={score:.2f} >= {threshold:.2f}, refusal kept", score
            )
        return Verdict(False, decision.route, f"verifier: P(good)={score:.2f} >= {threshold:.2f}", score)


def keep_refusal(fallback: FallbackSettings, decision: RouteDecision) -> bool:
    """Keep a refusal instead of escalating when the policy allows it and the evidence says the answer is
    absent: a weak best retrieval match AND a classifier confident the cheap route suffices (so a long read
    is not expected to find what retrieval missed)."""
    return fallback.keep_refusal_when_absent and refusal_evidence(decision.features, decision.probability, fallback)


def refusal_evidence(features: dict[str, float], probability: float | None, fallback: FallbackSettings) -> bool:
    """The absent-answer evidence alone (also scored by `selfroute eval absent`)."""
    top = features.get("top_score")
    if top is None or missing(top) or probability is None:
        return False
    return float(top) <= fallback.absent_max_top_score and probability >= fallback.absent_min_probability
