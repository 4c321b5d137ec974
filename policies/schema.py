"""The routing policy: which aliases route, which models serve each route, and how to decide."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from classifier.features import FEATURE_NAMES
from pipelines.settings import LongContextSettings, RagSettings
from policies.routes import Route


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Strict):
    model: str = Field(description="litellm model string, e.g. openai/gpt-4o-mini or local/smollm2-135m-instruct")
    api_base: str | None = None
    api_key_env: str | None = Field(
        None, description="name of the environment variable that holds the key; never the key itself"
    )
    timeout: float = Field(60.0, gt=0)
    max_retries: int = Field(0, ge=0, le=10)
    input_cost_per_mtok: float | None = Field(None, ge=0, description="USD per million prompt tokens")
    output_cost_per_mtok: float | None = Field(None, ge=0, description="USD per million completion tokens")
    cached_input_cost_per_mtok: float | None = Field(
        None, ge=0, description="USD per million prompt tokens read from the provider's prompt cache (default: input)"
    )
    cache_write_cost_per_mtok: float | None = Field(
        None, ge=0, description="USD per million prompt tokens written to the prompt cache (Anthropic; default: input)"
    )
    context_window: int | None = Field(
        None, ge=256, description="tokens the model accepts; default: litellm's model information (policies.limits)"
    )
    max_output_tokens: int | None = Field(
        None, ge=1, description="the most tokens the model answers with; default: litellm's model information"
    )
    cache_control: bool | None = Field(
        None,
        description="mark the long route's document block cacheable (Anthropic cache_control); "
        "default: on for Claude models",
    )
    prompt_cache_ttl_s: float = Field(
        300.0,
        ge=0,
        description="seconds a prompt prefix stays in the provider's cache after it was last sent (Anthropic's "
        "default TTL, OpenAI's typical idle eviction); routing estimates count a block sent within this as warm; "
        "0: never assume a warm cache",
    )
    prompt_cache_min_tokens: int = Field(
        1024, ge=0, description="shortest prefix the provider caches (OpenAI and Anthropic cache nothing shorter)"
    )

    @field_validator("api_key_env")
    @classmethod
    def _looks_like_env_name(cls, value: str | None) -> str | None:
        if value is not None and (not value.replace("_", "").isalnum() or value[0].isdigit()):
            raise ValueError("must be an environment variable name such as OPENAI_API_KEY, not a key")
        return value


class RuleSpec(_Strict):
    name: str | None = None
    feature: str
    op: Literal["<", "<=", ">", ">=", "==", "!="]
    value: float
    route: Route

    @field_validator("feature")
    @classmethod
    def _known_feature(cls, value: str) -> str:
        if value not in FEATURE_NAMES:
            raise ValueError(f"unknown routing feature {value!r}; known features: {', '.join(FEATURE_NAMES)}")
        return value


class ClassifierSettings(_Strict):
    model_path: str = Field(
        "builtin:default", description="'builtin:default' or a .skops path, relative to the policy file"
    )
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="P(cheap suffices) >= threshold routes to rag")
    threshold_source: str | None = Field(None, description="where the threshold came from (written by calibrate)")


class FallbackSettings(_Strict):
    enabled: bool = True
    keep_refusal_when_absent: bool = Field(
        False, description="keep the cheap route's refusal when the evidence says the answer is absent"
    )
    absent_max_top_score: float = Field(
        0.35, description="retrieval top similarity at or below which the answer is taken as absent"
    )
    absent_min_probability: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="…and the classifier's P(cheap suffices) at least this (0: P(cheap) showed no signal for absent answers)",
    )
    on_long_error: Literal["return_cheap", "error"] = Field(
        "return_cheap",
        description="when the long call fails after a refused cheap answer: send the cheap answer (with the "
        "x-selfroute-fallback-error header) or the long call's error",
    )


class RelativeThreshold(_Strict):
    """The verifier's threshold relative to this deployment's own traffic (gateway.routing.score_window), label-free:
    a verifier's P(good) ranks cheap answers on a corpus or model it never saw, but its scale moves, so no fixed
    threshold travels. Per policy and per key, over the key's last `window` checked cheap answers: the candidates are
    the answers whose P(good) falls in the lowest `pool` x (the window's share of refusals) of the window's scores,
    and a candidate escalates only while the long tokens escalated in the window stay within `refusal_spend` x the
    long tokens Self-Route's rule (escalate every refusal) would have spent on the window's refusals. Until the
    window holds `warm_up` answers the fixed threshold and refusal threshold decide."""

    refusal_spend: float = Field(
        0.9,
        gt=0.0,
        le=10.0,
        description="escalations' long tokens in the window at most this x the long tokens of the window's refusals "
        "(1.0: what Self-Route's rule would spend)",
    )
    pool: float = Field(
        1.5,
        gt=0.0,
        le=100.0,
        description="candidates: the answers in the lowest (this x the window's refusal share) of its P(good)",
    )
    window: int = Field(1000, ge=10, le=100_000, description="checked cheap answers of the key remembered")
    warm_up: int = Field(
        50, ge=1, description="answers in the window before the rule applies (before: the fixed thresholds)"
    )
    # variants (BENCHMARKS.md section 4, round seven): each default keeps the rule above
    long_share: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="instead of refusal_spend: escalations' long tokens in the window at most this x the long "
        "tokens of every answer in it (what always-long would have sent)",
    )
    min_share: float = Field(
        0.0, ge=0.0, le=1.0, description="candidates: at least this share of the window, whatever its refusal share"
    )
    cheap_weight: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="rank answers by (1 - this) x P(good) + this x the pre-route P(cheap) (0: P(good) alone)",
    )
    per_token: bool = Field(
        False, description="rank answers by their doubt (1 - the rank above) per long token: cheap escalations first"
    )
    source: str | None = Field(None, description="where these settings came from (a benchmark, a calibration)")

    @model_validator(mode="after")
    def _warm_up_within_window(self) -> RelativeThreshold:
        if self.warm_up > self.window:
            raise ValueError(f"warm_up ({self.warm_up}) must not exceed window ({self.window})")
        return self


class VerifierSettings(_Strict):
    model_path: str = Field(
        "builtin:verifier", description="'builtin:verifier' or a verifier .skops path, relative to the policy file"
    )
    threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="escalate the cheap answer when the verifier's P(good) < threshold; null: the model card's threshold",
    )
    threshold_source: str | None = Field(None, description="where the threshold came from (written by calibrate)")
    refusal_threshold: float | None = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="a cheap answer that says it is unanswerable escalates (Self-Route's rule) unless the "
        "verifier's P(good) is at least this (or fallback.keep_refusal_when_absent's evidence keeps it); "
        "1.0: every refusal escalates; null: the verifier's threshold alone decides refusals too",
    )
    logprobs: bool = Field(
        False,
        description="request token log-probabilities on the cheap leg (non-streamed answers; providers that "
        "return them) for a verifier that reads ans_logprob_mean/min; the client sees them only "
        "if it asked for them",
    )
    relative: RelativeThreshold | None = Field(
        None,
        description="a threshold relative to the key's own recent traffic (escalate about what Self-Route would, "
        "the least-trusted answers first); null: the fixed threshold alone",
    )


class ShadowBackoff(_Strict):
    """The shadow rate follows the refits (gateway.routing.learning.loop.shadow_scale_after): each `selfroute learn`
    run whose refit loses to the model in force multiplies `scale` by `factor`, one whose refit wins divides it by
    `factor`, within [min_scale, 1]; shadows are drawn at shadow_rate x scale. Shadows buy labels only for refits;
    where no refit beats the model in force (L-Eval in round nine: 0 of 22), they are a cost the escalations pay."""

    factor: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="a refit that loses to the model in force multiplies the shadow rate by this, one that wins "
        "divides it by this (never above shadow_rate)",
    )
    min_scale: float = Field(0.1, ge=0.0, le=1.0, description="the least share of shadow_rate it falls to")
    scale: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="in force: shadows are drawn at shadow_rate x this (selfroute learn writes it after each refit)",
    )


class LearningSettings(_Strict):
    """The router learning from its traffic (gateway.routing.learning): what it records and which labels it makes."""

    record_features: bool = Field(
        True,
        description="keep each routed request's features and scores in the ledger (request_features), "
        "what `selfroute learn`, `whatif` and `calibrate --from-ledger` read",
    )
    judge: bool = Field(
        False,
        description="on every escalation (both answers exist), ask the judge model whether the cheap "
        "answer was as good as the long one; the verdict is a label in the ledger",
    )
    judge_model: ModelConfig | None = Field(None, description="the judge; null: the long model")
    shadow_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="share of accepted cheap answers for which the long route also runs, "
        "in the background after the client has its answer, then the judge (needs judge: true)",
    )
    shadow_reference_tokens: int | None = Field(
        None,
        ge=1,
        description="tie the shadow rate to the long leg's cost: a request whose context (its context_tokens "
        "feature, what always-long would send) is longer than this is shadowed with probability shadow_rate x this / "
        "its tokens, so the shadows' expected long-leg tokens per accepted answer stay at most shadow_rate x this "
        "(learn weighs each shadow label by 1 / its probability); null: shadow_rate for every request",
    )
    shadow_backoff: ShadowBackoff | None = Field(
        None,
        description="lower the shadow rate while refits lose to the model in force, raise it when they win "
        "(selfroute learn writes its scale); null: shadow_rate always",
    )
    daily_budget_usd: float = Field(
        1.0,
        ge=0.0,
        description="most spent on shadow and judge legs per UTC day (as the ledger prices them); "
        "past it no shadow or judge is started until the next day",
    )

    @model_validator(mode="after")
    def _shadow_needs_judge(self) -> LearningSettings:
        if self.shadow_rate > 0 and not self.judge:
            raise ValueError("shadow_rate > 0 needs judge: true (a shadow answer is only a label once judged)")
        return self


class RoutingSettings(_Strict):
    rules: list[RuleSpec] = Field(default_factory=list)
    classifier: ClassifierSettings | None = ClassifierSettings()
    default_route: Route = Route.LONG
    fallback: FallbackSettings = FallbackSettings()
    verifier: VerifierSettings | None = Field(
        None,
        description="check cheap answers with the learned verifier (gateway.routing.escalation); "
        "null: escalate only answers that say they are unanswerable (Self-Route's literal rule)",
    )
    learning: LearningSettings = LearningSettings()


class SecuritySettings(_Strict):
    injection: Literal["off", "flag", "strip", "block"] = Field(
        "flag",
        description="document-injection scan of documents and passages (pipelines.safety.injection): off, flag "
        "(record findings), strip (remove the matched spans before the model sees them), block (refuse the request)",
    )
    grounding: Literal["off", "flag", "drop"] = Field(
        "off",
        description="grounding check of answers against the passages sent (pipelines.safety.grounding): off, flag "
        "(record unsupported sentences), drop (remove them from the answer)",
    )
    grounding_threshold: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="a sentence scoring below this is unsupported (0.6 x max cosine + 0.4 x word overlap, capped at 0.3 "
        "when it holds a number absent from the passages); 0.5 from tests/benchmarks/bench_grounding.py",
    )


class LedgerSettings(_Strict):
    store_texts: bool = Field(
        False,
        description="also keep the question, the passages sent and the answers with each routed request's "
        "features (request_features); off: the ledger holds features and scores only, never prompts or documents",
    )


class PassthroughSettings(_Strict):
    allow: list[str] = Field(
        default_factory=list,
        description="fnmatch patterns of the model names any key may use by pass-through, beside the models the "
        "policy names (cheap, long, alternates) and the gateway's embedding model; [] (the default): only those. "
        "Providers that reach local services (ollama/, llamafile/, local/, ...: policies.passthrough) need a "
        "pattern naming the provider itself ('ollama/*'); '*' does not reach them",
    )


class RequestLimits(_Strict):
    """How much work one request may ask for (gateway.routing.request_limits): beyond these a request is refused
    before anything is scanned, counted or embedded. Defaults sized on the 2-core development machine: MiniLM embeds
    roughly 100-200 short texts a second there, so the defaults bound a request to seconds, not minutes."""

    attached_documents: int = Field(
        64,
        ge=1,
        description="documents attached to one request (selfroute.documents), and documents in one POST "
        "/v1/collections/{name}/documents; more is a 400 too_many_documents",
    )
    attached_bytes: int = Field(
        2_000_000,
        ge=1,
        description="UTF-8 bytes of those documents' texts together; more is a 413 "
        "documents_too_large (rag.max_attached_tokens also applies)",
    )
    embedding_inputs: int = Field(
        256, ge=1, description="inputs of one POST /v1/embeddings; more is a 400 too_many_inputs"
    )
    embedding_input_bytes: int = Field(
        1_000_000,
        ge=1,
        description="UTF-8 bytes of one POST /v1/embeddings' inputs together; more is a 413 input_too_large",
    )


class Policy(_Strict):
    name: str = "default"
    aliases: list[str] = Field(default_factory=lambda: ["selfroute"], min_length=1)
    cheap: ModelConfig
    long: ModelConfig
    long_alternates: list[ModelConfig] = Field(
        default_factory=list,
        description="tried in order when the long model fails (timeout, 429, 5xx); they get the same packed prompt",
    )
    rag: RagSettings = RagSettings()
    long_context: LongContextSettings = LongContextSettings()
    routing: RoutingSettings = RoutingSettings()
    security: SecuritySettings = SecuritySettings()
    passthrough: PassthroughSettings = PassthroughSettings()
    ledger: LedgerSettings = LedgerSettings()
    request_limits: RequestLimits = RequestLimits()

    @model_validator(mode="after")
    def _aliases_are_not_models(self) -> Policy:
        for alias in self.aliases:
            if alias in (self.cheap.model, self.long.model):
                raise ValueError(f"alias {alias!r} is also a model name; pick a distinct alias")
        return self
