"""Filters on the store's tables, built with LanceDB's typed expressions (lancedb.expr) rather than SQL strings:
the values (document ids, collection names, which a client chooses) are literals LanceDB quotes itself, never
text spliced into a query. Only query builders and delete take them (count_rows takes SQL text alone, and LanceDB's
own rendering of a literal does not survive every value: a backslash before a quote breaks it), so nothing here is
turned back into SQL."""

from __future__ import annotations

from collections.abc import Iterable

from lancedb.expr import Expr, col, lit

# terms per filter when many are ORed or listed: keeps each query's plan small
BATCH = 200


def equals(column: str, value: str | int) -> Expr:
    return col(column) == lit(value)


def among(column: str, values: Iterable[str | int]) -> Expr:
    return col(column).isin(list(values))


def positions(doc_id: str, wanted: Iterable[int]) -> Expr:
    """The chunks of one document at these positions."""
    return equals("doc_id", doc_id) & among("position", sorted({int(p) for p in wanted}))


def positions_from(doc_id: str, first: int) -> Expr:
    """The chunks of one document from this position on (a replaced document's surplus)."""
    return equals("doc_id", doc_id) & (col("position") >= lit(int(first)))


def any_of(filters: list[Expr]) -> Expr:
    combined = filters[0]
    for more in filters[1:]:
        combined = combined | more
    return combined


def batches(filters: list[Expr]) -> Iterable[Expr]:
    """The filters ORed in groups of BATCH (one delete per group)."""
    for i in range(0, len(filters), BATCH):
        yield any_of(filters[i : i + BATCH])
