"""Where a routed request's context comes from, which route it takes, and the prompt for that route.

Synchronous on purpose: embedding, LanceDB and tokenising are CPU or disk work, so the async
handlers call these methods in worker threads.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from classifier.features import RETRIEVAL_FEATURES, DocumentStats, extract_features
from gateway.protocol import ChatCompletionRequest
from gateway.routing.decision import RouteDecision, Router, rule_label, rule_matches
from gateway.routing.errors import InvalidRequest, RequestTooLarge
from gateway.routing.escalation import CheapAnswer, DocumentIndex
from gateway.routing.inputs import document_stats, document_stats_from_info, retrieval_signals
from gateway.routing.request_limits import check_documents
from pipelines.base import ContextRequest, PreparedPrompt
from pipelines.cache import LockedLRU
from pipelines.documents import Document
from pipelines.errors import CollectionNotFound
from pipelines.long_context import ContextTooLarge, LongContextPipeline, UnitCache, question_tokens
from pipelines.messages import TOKENS_PER_MESSAGE, carry_history, content_text, count_message_tokens
from pipelines.question import extract_question
from pipelines.rag import INSTRUCTIONS as RAG_INSTRUCTIONS
from pipelines.rag import RagPipeline, Retrieval
from pipelines.scope import SHARED, KeyScope
from pipelines.store import DocumentStore, content_hash
from pipelines.store.inline import embedding_started
from pipelines.tokens import count_tokens
from policies.routes import LONG, RAG, Route
from policies.schema import Policy

logger = logging.getLogger(__name__)

PROMPT_DOCUMENT_ID = "prompt"
# attached documents (and the conversation as a document) carry their key's id in their metadata, so their inline
# collection (named by content) and cached statistics are per key; metadata never reaches a prompt
STATS_CACHE_SIZE = 256
# document term indexes for the answer verifier: larger than the statistics, so fewer are kept
INDEX_CACHE_SIZE = 32
ATTACHED_COUNT_SLICE = 100_000  # characters counted at a time when checking the attached-documents cap
# passage labels and headings in a RAG prompt, besides its instructions and question
RAG_LABEL_ALLOWANCE = 64


def documents_key(documents: list[Document]) -> tuple:
    return tuple((d.id, content_hash(d)) for d in documents)


def scoped_key(documents: list[Document], scope: KeyScope) -> tuple:
    """The caches' key of documents attached (or a conversation sent) under a key scope: one key's statistics,
    units, term index and warm-prefix record are never another's."""
    return (*documents_key(documents), ("key", scope.key_id))


@dataclass
class RoutePlan:
    source: str  # "collection" | "documents" | "prompt"
    context: ContextRequest
    stats: DocumentStats
    decision: RouteDecision
    retrieval: Retrieval | None = None
    original_messages: list[dict] = field(default_factory=list)
    # the context's documents as the caches know them: ids and content hashes (content, title, metadata), in order,
    # and the key scope of attached documents or a conversation (scoped_key)
    documents_key: tuple = ()
    verbatim_tokens: int | None = None  # the conversation's tokens, once counted (source "prompt")
    # the context's tokens when its retrieval pass began embedding it for this request (the request that started the
    # one ingestion of new documents, pipelines.store.inline.embedding_started)
    embedded_tokens: int = 0
    router: Router | None = None  # the router that decided (a policy reload may replace the planner's meanwhile)

    @property
    def has_document(self) -> bool:
        """False for a plain chat whose conversation is only the question (no context to answer from)."""
        return not (
            self.source == "prompt" and all(d.text == self.context.question for d in self.context.documents or [])
        )

    @property
    def context_tokens(self) -> int:
        """What always-long-context would send: the whole context plus the question."""
        return self.stats.context_tokens + count_tokens(self.context.question)

    @cached_property
    def block_key(self) -> str:
        """Names the long prompt's document block at the provider (gateway.routing.warm_cache): the documents in
        reading order and the conversation before the question, which comes before the block in the prompt. Built
        from content hashes the planner already has, never from the rendered prompt."""
        messages = self.context.messages
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages))
        payload = json.dumps(
            [self.source, self.documents_key, messages[:last_user]], sort_keys=True, default=str, ensure_ascii=False
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()


_V = TypeVar("_V")


class RoutePlanner:
    def __init__(self, policy: Policy, store: DocumentStore, router: Router):
        self.policy = policy
        self.store = store
        self.router = router
        self.rag = RagPipeline(store, policy.rag)
        units = UnitCache()  # both pipelines cut the same documents into the same units
        self.long = LongContextPipeline(
            policy.long_context, window_tokens=policy.long.context_window or 128_000, store=store, unit_cache=units
        )
        # "direct" sends the whole context to the cheap model, so it packs for the cheap model's window
        self.direct = LongContextPipeline(
            policy.long_context.model_copy(update={"window_tokens": None}),
            window_tokens=policy.cheap.context_window or 8192,
            store=store,
            unit_cache=units,
        )
        # sections and cross-references of a long document take a while to count: asking about the
        # same attached documents again reuses them, like the embeddings
        self._stats_cache: LockedLRU[tuple, DocumentStats] = LockedLRU(STATS_CACHE_SIZE)
        self._index_cache: LockedLRU[tuple, DocumentIndex] = LockedLRU(INDEX_CACHE_SIZE)

    @staticmethod
    def _cached(
        cache: LockedLRU[tuple, _V],
        documents: list[Document],
        compute: Callable[[list[Document]], _V],
        key: tuple | None = None,
    ) -> _V:
        key = key if key is not None else documents_key(documents)
        return cache.get_or_make(key, lambda: compute(documents))

    def _document_stats(self, documents: list[Document], key: tuple, check_size: bool = False) -> DocumentStats:
        def compute(docs: list[Document]) -> DocumentStats:
            if check_size:  # only for documents not seen before: those seen passed it already
                self._check_attached_size(docs)
            return document_stats(docs)

        return self._cached(self._stats_cache, documents, compute, key)

    def _document_index(self, documents: list[Document], key: tuple | None = None) -> DocumentIndex:
        from classifier.answer_features import document_index

        return self._cached(
            self._index_cache, documents, lambda docs: document_index("\n\n".join(d.text for d in docs)), key
        )

    def _collection_index(self, name: str) -> DocumentIndex | None:
        """A stored collection's term index, built once per version of its contents (the documents' ids and
        content hashes) and cached like an attached document's."""
        info = self.store.collection(name)
        if info is None or not info.documents:
            return None
        version = ("collection", name, tuple((d.id, d.content_hash) for d in info.documents))
        found = self._index_cache.get(version)
        if found is not None:
            return found
        return self._document_index(self.store.documents(name), key=version)

    # -- context --------------------------------------------------------------------------------
    def resolve_context(
        self,
        chat: ChatCompletionRequest,
        messages: list[dict],
        header_collection: str | None,
        scope: KeyScope = SHARED,
    ) -> tuple[str, ContextRequest, DocumentStats, tuple]:
        """(source, context, document statistics, the documents' key: ids and content hashes in order, and for
        attached documents or the conversation the key scope they were sent under)."""
        options = chat.selfroute
        collection = (options.collection if options else None) or header_collection
        if options and options.documents:
            if collection:
                raise InvalidRequest(
                    "send either selfroute.documents or a collection, not both",
                    param="selfroute",
                    code="conflicting_context",
                )
            check_documents(self.policy.request_limits, [d.text for d in options.documents], "selfroute.documents")
            documents = [
                Document(id=d.id or f"doc-{i + 1}", text=d.text, title=d.title, metadata=d.metadata)
                for i, d in enumerate(options.documents)
            ]
            if len({d.id for d in documents}) != len(documents):
                raise InvalidRequest(
                    "selfroute.documents ids must be unique",
                    param="selfroute.documents",
                    code="duplicate_document_id",
                )
            question = self._last_user_text(messages)
            key = scoped_key(documents, scope)
            stats = self._document_stats(documents, key, check_size=True)
            return "documents", ContextRequest(question, messages, documents=documents, scope=scope), stats, key
        if collection:
            try:
                info = self.store.collection(collection)
            except ValueError as exc:
                raise InvalidRequest(str(exc), param="selfroute.collection", code="invalid_collection") from None
            if info is None or not info.documents:  # the server answers 404 (gateway.server.errors)
                raise CollectionNotFound(collection)
            question = self._last_user_text(messages)
            key = ("collection", collection, tuple((d.id, d.content_hash) for d in info.documents))
            return (
                "collection",
                ContextRequest(question, messages, collection=collection, scope=scope),
                document_stats_from_info(info),
                key,
            )
        try:
            question, context_text = extract_question(messages, self.policy.rag.question_marker)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="messages", code="no_user_message") from None
        if not question:
            raise InvalidRequest("the last user message has no text to answer", param="messages", code="empty_question")
        # scoped like attached documents: a long conversation's statistics, units and embeddings are cached per key
        documents = [Document(id=PROMPT_DOCUMENT_ID, text=context_text or question, title="conversation")]
        key = scoped_key(documents, scope)
        return (
            "prompt",
            ContextRequest(question, messages, documents=documents, scope=scope),
            self._document_stats(documents, key),
            key,
        )

    def _check_attached_size(self, documents: list[Document]) -> None:
        """RequestTooLarge (the client's 413) for attached documents over the policy's cap, before anything is
        counted, split or embedded for them. A token covers at least one byte of UTF-8, so sets under the cap in bytes pass uncounted;
        larger ones are counted in slices only until the cap is passed."""
        cap = self.policy.rag.max_attached_tokens
        if sum(len(d.text.encode()) for d in documents) <= cap:
            return
        total = 0
        for doc in documents:
            for start in range(0, len(doc.text), ATTACHED_COUNT_SLICE):
                total += count_tokens(doc.text[start : start + ATTACHED_COUNT_SLICE])
                if total > cap:
                    raise RequestTooLarge(
                        f"the attached documents hold more than {cap:,} tokens (the policy's "
                        "rag.max_attached_tokens); ingest them into a collection once (POST "
                        "/v1/collections/{name}/documents or `selfroute ingest`) and ask with "
                        "selfroute.collection instead",
                        param="selfroute.documents",
                        code="documents_too_large",
                    )

    def _check_conversation_size(self, source: str, stats: DocumentStats) -> None:
        """RequestTooLarge (the client's 413) before the rag route indexes a conversation (a pasted document) over
        rag.max_attached_tokens, as for attached documents: its background ingestion would outlive the request and
        pass the key's --tpm. Only the indexing is refused: the direct and long routes pack the conversation."""
        cap = self.policy.rag.max_attached_tokens
        if source == "prompt" and stats.context_tokens > cap:
            raise RequestTooLarge(
                f"the conversation's context holds {stats.context_tokens:,} tokens, more than the {cap:,} the rag "
                "route indexes (the policy's rag.max_attached_tokens); ingest the document into a collection once "
                "(POST /v1/collections/{name}/documents or `selfroute ingest`) and ask with selfroute.collection "
                "instead",
                param="messages",
                code="documents_too_large",
            )

    @staticmethod
    def _last_user_text(messages: list[dict]) -> str:
        for message in reversed(messages):
            if message.get("role") == "user":
                text = content_text(message.get("content")).strip()
                if text:
                    return text
        raise InvalidRequest("the conversation has no user message with text", param="messages", code="no_user_message")

    # -- decision -------------------------------------------------------------------------------
    def _needs_retrieval(self, features: dict[str, float], router: Router) -> bool:
        """Retrieval is skipped when a rule on query/document features decides before any rule or
        classifier that would read retrieval features."""
        for index, rule in enumerate(self.policy.routing.rules):
            if rule.feature in RETRIEVAL_FEATURES:
                return True
            if rule_matches(rule, features):
                logger.debug("rule %s decides without retrieval", rule_label(rule, index))
                return False
        return router.model is not None and self.policy.routing.classifier is not None

    def retrieve(self, context: ContextRequest) -> Retrieval:
        return self.rag.retrieve_for(context)

    def plan(
        self,
        chat: ChatCompletionRequest,
        messages: list[dict],
        header_collection: str | None = None,
        scope: KeyScope = SHARED,
    ) -> RoutePlan:
        """`scope`: the caller's key scope (pipelines.scope), under which attached documents, the conversation and
        the question's vector are cached."""
        router = self.router  # one router for the whole decision, whatever a reload swaps in meanwhile
        source, context, stats, key = self.resolve_context(chat, messages, header_collection, scope)
        features = extract_features(context.question, stats, None)
        retrieval = None
        embedded = 0
        forced = chat.selfroute.route if chat.selfroute else None
        if forced is None and self._needs_retrieval(features, router):
            self._check_conversation_size(source, stats)
            with embedding_started() as started:
                retrieval = self.retrieve(context)
            embedded = stats.context_tokens if started else 0
            features = extract_features(context.question, stats, retrieval_signals(retrieval))
        if forced is not None:
            decision = RouteDecision(Route(forced), f"forced by selfroute.route={forced}", None, None, features)
        else:
            decision = router.decide(features)
        return RoutePlan(
            source, context, stats, decision, retrieval, messages, key, router=router, embedded_tokens=embedded
        )

    # -- prompts --------------------------------------------------------------------------------
    def prepare(self, plan: RoutePlan, route: str) -> PreparedPrompt:
        return self.prepare_counted(plan, route)[0]

    def prepare_counted(self, plan: RoutePlan, route: str) -> tuple[PreparedPrompt, int]:
        """The prompt, and the context's tokens when preparing it began embedding new documents for this request: a
        rag prompt retrieved now, or the long and direct routes' unit scores (StoreScorer) read from an inline
        collection made now (recorded like the plan's embedded_tokens)."""
        try:
            with embedding_started() as started:
                prepared = self._prepare(plan, route)
            return prepared, plan.stats.context_tokens if started else 0
        except ContextTooLarge as exc:
            raise InvalidRequest(
                f"the question does not fit the {route} route's window: {exc}",
                param="messages",
                code="context_length_exceeded",
            ) from None

    def _prepare(self, plan: RoutePlan, route: str) -> PreparedPrompt:
        if route == RAG:
            if plan.retrieval is None:  # kept on the plan: the answer check reads the passages sent
                self._check_conversation_size(plan.source, plan.stats)
                plan.retrieval = self.retrieve(plan.context)
            return self.rag.prepare(plan.context, plan.retrieval)
        pipeline = self.long if route == LONG else self.direct
        if plan.source == "prompt":
            # the pure drop-in case: when the conversation fits, send it exactly as the client wrote it
            tokens = self._verbatim_tokens(plan)
            if tokens <= pipeline.budget_tokens:
                provenance = {
                    "route": route,
                    "source": "prompt",
                    "context_tokens": tokens,
                    "all_fitted": True,
                    "documents": [{"id": PROMPT_DOCUMENT_ID, "title": "conversation"}],
                }
                return PreparedPrompt(plan.original_messages, provenance, tokens)
        return pipeline.prepare(plan.context)

    def cheap_answer(
        self,
        plan: RoutePlan,
        prepared: PreparedPrompt,
        route: str,
        text: str | None,
        logprobs: list[float] | None = None,
    ) -> CheapAnswer:
        """The cheap answer with what it was produced from, for the answer check (gateway.routing.escalation).
        The document index is computed once per attached content, or per version of a stored collection,
        and cached."""
        if route == RAG:
            passages = [p.text for p in plan.retrieval.passages] if plan.retrieval is not None else []
        else:  # direct: the whole context went to the cheap model
            passages = [content_text(m.get("content")) for m in prepared.messages]
        documents = plan.context.documents
        index: DocumentIndex | None
        if documents:
            index = self._document_index(documents, plan.documents_key)
        else:
            index = self._collection_index(plan.context.collection) if plan.context.collection else None
        from gateway.routing.answer_support import retrieval_inputs, sent_chunk_vectors

        retrieval = retrieval_inputs(plan.context.question, plan.retrieval) if route == RAG else None
        sent = plan.retrieval if route == RAG else None
        return CheapAnswer(
            text,
            plan.context.question,
            passages,
            index,
            logprobs,
            retrieval=retrieval,
            embed=self.store.embedder.embed_queries,
            passage_vectors=(lambda: sent_chunk_vectors(self.store, sent)) if sent is not None else None,
        )

    def estimate_tokens(self, plan: RoutePlan, route: str) -> tuple[int, bool]:
        """(prompt tokens, exact) for a route without preparing its prompt: no unit scoring, no rendering,
        no retrieval beyond what the plan already did."""
        try:
            return self._estimate_tokens(plan, route)
        except ContextTooLarge as exc:
            raise InvalidRequest(
                f"the question does not fit the {route} route's window: {exc}",
                param="messages",
                code="context_length_exceeded",
            ) from None

    def _estimate_tokens(self, plan: RoutePlan, route: str) -> tuple[int, bool]:
        if route == RAG:
            if plan.retrieval is not None:  # the prompt from passages already retrieved is cheap to build
                return self.rag.prepare(plan.context, plan.retrieval).prompt_tokens, True
            history = carry_history(plan.context.messages, self.rag.history_budget_tokens)
            question = count_tokens(plan.context.question)
            passages = min(self.rag.settings.context_budget_tokens, plan.stats.context_tokens)
            overhead = count_tokens(RAG_INSTRUCTIONS) + RAG_LABEL_ALLOWANCE
            return count_message_tokens(history) + TOKENS_PER_MESSAGE + overhead + question + passages, False
        pipeline = self.long if route == LONG else self.direct
        if plan.source == "prompt":
            tokens = self._verbatim_tokens(plan)
            if tokens <= pipeline.budget_tokens:
                return tokens, True
        return pipeline.estimate_tokens(plan.context)

    def _verbatim_tokens(self, plan: RoutePlan) -> int:
        """The conversation's tokens as the client wrote it, counted once per plan (it may hold a pasted document)."""
        if plan.verbatim_tokens is None:
            plan.verbatim_tokens = count_message_tokens(plan.original_messages)
        return plan.verbatim_tokens

    def estimate_long(self, plan: RoutePlan) -> tuple[int, bool, int | None]:
        """(prompt tokens, exact, cacheable prefix tokens) of the long route, like estimate_tokens. The prefix is
        everything before the question when the document block will come back unchanged for the next question on
        these documents (every unit fits, in reading order: what gateway.routing.prompt_cache marks); None when
        units are chosen or ordered per question, or the conversation goes as the client wrote it."""
        tokens, exact = self.estimate_tokens(plan, LONG)
        verbatim = plan.source == "prompt" and self._verbatim_tokens(plan) <= self.long.budget_tokens
        if verbatim or not exact or self.long.settings.placement != "reading":
            return tokens, exact, None
        return tokens, exact, tokens - question_tokens(plan.context.question)

    def provenance(self, plan: RoutePlan, prepared: PreparedPrompt, route: str) -> dict[str, Any]:
        return {"source": plan.source, "question": plan.context.question[:500], **prepared.provenance, "route": route}
