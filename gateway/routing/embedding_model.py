"""The gateway's own embedding model as a ledger leg: its name for clients and its (zero) price. Document posts,
/v1/embeddings and routed requests that embed new documents record their tokens under it, so they count against
the key's TPM window."""

from __future__ import annotations

from pathlib import Path

from gateway.ledger.entry import RequestLedgerEntry
from policies.routes import PASSTHROUGH
from policies.schema import ModelConfig, Policy

PACKAGED_EMBEDDING_MODEL = "local/all-minilm-l6-v2"


def local_embedding_model(policy: Policy) -> str:
    """The name clients use for the gateway's own embedding model."""
    path = policy.rag.embedding_model
    return PACKAGED_EMBEDDING_MODEL if path is None else "local/" + Path(path).name.lower()


def embedding_config(policy: Policy) -> ModelConfig:
    return ModelConfig(model=local_embedding_model(policy), input_cost_per_mtok=0.0, output_cost_per_mtok=0.0)


def record_embedded(entry: RequestLedgerEntry | None, policy: Policy, tokens: int, latency_ms: float) -> None:
    """The tokens planning embedded for this request (new attached documents or conversation), as a document post
    records its own: one leg of the embedding model, before the answer's legs (the counterfactual reads the last)."""
    if entry is not None and tokens:
        entry.add_call(
            embedding_config(policy), PASSTHROUGH, {"prompt_tokens": tokens, "completion_tokens": 0}, latency_ms
        )
