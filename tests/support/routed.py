"""What the routed-gateway tests share (tests/routing/..., tests/server/test_tracing.py, test_usage.py): a manual
with one planted fact and the question about it, `ask` through the openai client, the toy verifier, a fixed-P(cheap)
route model, a settable clock and warm-cache documents, and the learning tests' answers and ledger reads."""

from __future__ import annotations

import sqlite3

import numpy as np
import openai

from classifier.verifier import train_verifier

PLANTED = "The maintenance password for the Zephyr pump is BLUE-HERON-42."
FILLER = [
    "Section {n}. Operating notes {n}\n\nThe pump housing must be inspected every {n} weeks for corrosion. "
    "Operators record the pressure reading in the log book and compare it with the previous shift. "
    "Valves are closed clockwise and opened counter-clockwise; never force a valve past its stop.",
]


def manual(sections: int = 30, planted_at: int = 17) -> str:
    parts = []
    for n in range(1, sections + 1):
        text = FILLER[0].format(n=n)
        if n == planted_at:
            text += " " + PLANTED
        parts.append(text)
    return "\n\n".join(parts)


QUESTION = "What is the maintenance password for the Zephyr pump?"


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def ask(url: str, question: str, **selfroute):
    return client(url).chat.completions.with_raw_response.create(
        model="selfroute", messages=[{"role": "user", "content": question}], extra_body={"selfroute": selfroute}
    )


def toy_verifier():
    """Trusts answers whose new words are in the passages, and refusals; doubts the rest."""
    rng = np.random.default_rng(0)
    rows, labels = [], []
    for _ in range(400):
        support, refusal = float(rng.uniform()), float(rng.uniform() < 0.2)
        rows.append({"ans_support_passages": support, "ans_refusal": refusal})
        labels.append(int(support > 0.5 or refusal == 1.0))
    groups = [f"d{i % 10}" for i in range(len(rows))]
    return train_verifier(
        rows, labels, groups, feature_names=["ans_support_passages", "ans_refusal"], n_splits=3, escalation_share=0.3
    ).model


class FixedModel:
    """A model stand-in that returns a fixed P(cheap), to test the decision logic alone."""

    def __init__(self, p):
        self.p = p
        self.seen = []

    def cheap_probability(self, features):
        self.seen.append(features)
        return self.p


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def documents(topic: str) -> list[dict]:
    return [
        {"id": f"{topic}-notes", "text": f"The {topic} valves close clockwise. " * 40},
        {"id": f"{topic}-manual", "text": f"The {topic} pumps hum at dawn. " * 30},
    ]


# learning (tests/routing/learning) ------------------------------------------------------------------------------
DOUBTED = "It is PURPLE-GIRAFFE-99, printed on the lid."  # the toy verifier escalates it
TRUSTED = "The maintenance password is BLUE-HERON-42."


def rows(app, table: str) -> list[dict]:
    conn = sqlite3.connect(app.state.gateway.ledger.path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY created_at")]
    finally:
        conn.close()


def settle(app, server) -> None:
    """Stop the gateway: its shutdown waits for the learning work, then the ledger is flushed and closed."""
    server.__exit__(None, None, None)
