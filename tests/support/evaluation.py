"""What the offline evaluation tests share (tests/evaluation/...): prices, the replay's policy (two rules, a classifier
threshold, fallback as given), a prompt cache's prices, and replay items scored by a verifier."""

import dataclasses

from gateway.evaluation.replay import LongCache, Prices, ReplayItem
from policies.schema import Policy

PRICES = Prices(1.0, 2.0, 10.0, 20.0, "test")


def policy(**fallback) -> Policy:
    return Policy.model_validate(
        {
            "cheap": {"model": "a/cheap"},
            "long": {"model": "a/long"},
            "routing": {
                "rules": [
                    {"name": "short", "feature": "context_tokens", "op": "<", "value": 1500, "route": "direct"},
                    {"name": "refs", "feature": "cross_ref_count", "op": ">=", "value": 20, "route": "long"},
                ],
                "classifier": {"threshold": 0.5},
                "fallback": fallback,
            },
        }
    )


def cached(write=12.5, window=None, min_prefix=1024):
    return dataclasses.replace(PRICES, long_cache=LongCache(1.0, write, window, min_prefix, "test"))


def item(rag, lc, p, refused=False, context=4000, cross_refs=0, top=0.6, task="t", verifier=None):
    """One replayed question: the two routes' scores and tokens, the router's P(cheap), the verifier's P(good)."""
    return ReplayItem(
        doc_id="d",
        group="d",
        query="q",
        rag_score=rag,
        lc_score=lc,
        rag_refused=refused,
        rag_prompt_tokens=1000,
        long_prompt_tokens=5000,
        direct_prompt_tokens=context,
        rag_output_tokens=10,
        long_output_tokens=20,
        features={"context_tokens": context, "cross_ref_count": cross_refs, "top_score": top},
        probability=p,
        task=task,
        verifier_score=verifier,
    )


def verified_item(rag, lc, p, v, task="t"):
    return item(rag, lc, p, task=task, verifier=v)


# the verifier ranks the bad cheap answers lowest; P(cheap) is uninformative
VERIFIED_ITEMS = [
    verified_item(1.0, 1.0, 0.9, 0.9),
    verified_item(1.0, 0.0, 0.9, 0.8),
    verified_item(1.0, 1.0, 0.9, 0.7),
    verified_item(0.0, 1.0, 0.9, 0.2),
    verified_item(0.0, 1.0, 0.9, 0.1),
    verified_item(0.5, 0.5, 0.9, 0.6),
]
