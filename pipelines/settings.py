"""Pipeline settings. The policy schema embeds these, so they validate with the policy."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipelines.embedding import DEFAULT_BACKEND, Backend

DEFAULT_UNANSWERABLE_PATTERNS = [
    r"^\W*unanswerable\W*$",
    r"\bunanswerable\b",
    r"\b(?:i|we) (?:cannot|can ?not|can't|am unable to|are unable to) (?:answer|determine|find|tell)",
    r"\bcannot be (?:answered|determined|found) (?:from|based on|in|with) the (?:given |provided )?"
    r"(?:passages?|context|documents?|text|information)",
    r"\b(?:not|no) (?:mentioned|provided|stated|found|specified|given) in the (?:given |provided )?"
    r"(?:passages?|context|documents?|text|information)",
    r"\b(?:passages?|context|documents?|text|transcript|information) (?:does|do) not (?:contain|mention|provide|"
    r"say|specify|include|state|give)",
    # the opening of a reply that declares the answer missing: "There is no (specific) mention of ..."
    r"^\W*(?:based on the (?:given |provided )?(?:passages?|context|documents?|text|information),? )?"
    r"there (?:is|are) (?:no|not enough) (?:specific |direct )?(?:information|mention|details|indication|evidence)",
    r"\bnot enough information\b",
    r"^\W*it is not (?:specified|mentioned|stated|provided|given) in the",
    r"\binsufficient (?:information|context)",
    r"无法回答",
    r"无法(?:确定|判断|得知)",
    r"(?:文中|上下文|文档|材料)(?:中)?(?:没有|未)(?:提及|提到|给出|说明)",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChunkingSettings(_Strict):
    # all-MiniLM-L6-v2 truncates at 256 word pieces; 200 tiktoken tokens stays under that for English.
    chunk_tokens: int = Field(200, ge=16, le=4096)
    chunk_overlap: int = Field(32, ge=0, le=1024)


class RagSettings(_Strict):
    embedding_model: str | None = Field(
        None, description="sentence-transformers model path; null = the packaged all-MiniLM-L6-v2"
    )
    embedding_batch_size: int = Field(64, ge=1, le=4096)
    embedding_backend: Backend = Field(
        DEFAULT_BACKEND,
        description="onnx-int8 (the default): the model exported to ONNX once per model version (cached in "
        "$SELFROUTE_MODEL_CACHE, else ~/.cache/selfroute/models), its weights quantised per channel, run by onnxruntime "
        "without torch in the gateway's memory (vectors at cosine ~0.99 to fp32's: another embedding space); onnx: the "
        "fp32 export (torch's vectors); openvino: the onnx export run by OpenVINO (extra selfroute[openvino]; bfloat16 "
        "where the CPU has it); torch: sentence-transformers",
    )
    chunking: ChunkingSettings = ChunkingSettings()
    top_k: int = Field(8, ge=1, le=200)
    hybrid: bool = True
    rrf_k: int = Field(60, ge=1)
    expansion_neighbours: int = Field(2, ge=0, le=20)
    context_budget_tokens: int = Field(2000, ge=64)
    unanswerable_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_UNANSWERABLE_PATTERNS))
    max_attached_tokens: int = Field(
        400_000,
        ge=1,
        description="documents attached to one request may hold at most this many tokens "
        "together, and so may the conversation the rag route would index (413 beyond it): larger sets belong "
        "in a collection, ingested once",
    )
    inline_cache_collections: int = Field(
        256,
        ge=1,
        description="documents attached to requests stay embedded for this many distinct document sets "
        "(least recently used dropped first), counted over the whole store: every replica sharing it",
    )
    inline_cache_idle_seconds: float = Field(
        600,
        ge=0,
        description="an attached document set used (by any replica) within this many seconds is never "
        "dropped, even past inline_cache_collections: the store may hold more until they go idle",
    )
    first_pass_candidates: int = Field(
        16,
        ge=0,
        le=500,
        description="the first questions on new attached documents are answered while the documents are embedded "
        "in the background: their chunks ranked by BM25, the best this many embedded and ranked by vector (and "
        "fused with the BM25 ranking); 0 = embed all of them before answering",
    )
    question_marker: str | None = Field(
        None, description="in a plain long prompt, the text after the last occurrence of this marker is the question"
    )


class LongContextSettings(_Strict):
    window_tokens: int | None = Field(None, ge=256, description="null = the long model's context window")
    answer_reserve_tokens: int = Field(512, ge=0)
    placement: Literal["reading", "edges"] = "reading"
    unit_min_tokens: int = Field(200, ge=1)
    unit_max_tokens: int = Field(4000, ge=64)
