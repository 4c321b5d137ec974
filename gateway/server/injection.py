"""The policy's document-injection mode (security.injection) applied where documents enter: documents attached
to a routed request, and documents posted to a collection. The rules live in pipelines.safety.injection.

flag: the request goes on; its findings are reported (x-selfroute-flags: injection, `selfroute.flags` in the body,
and `flags` in the ledger's provenance). strip: the matched spans are removed before anything is embedded or sent,
and reported. block: 400 document_injection naming the document and the rules.
"""

from __future__ import annotations

import hashlib
from typing import Any

import anyio

from gateway.errors import GatewayError
from gateway.protocol import ChatCompletionRequest, InlineDocument
from gateway.routing.request_limits import check_documents
from gateway.server import headers
from pipelines.cache import LockedLRU
from pipelines.scope import SHARED, KeyScope
from policies.schema import Policy

INJECTION_FLAG = "injection"
MAX_FINDINGS_PER_DOCUMENT = 20
SCAN_CACHE_SIZE = 256

# Scanning a 100k-token document takes ~100 ms; asking about the same attached document again reuses the
# result, like the document's embeddings and statistics: keyed by the text's hash and by the key that sent it, so
# nothing is shared between different texts, and a key's timing never tells it that another key sent this text.
_scans: LockedLRU[tuple[KeyScope, str, str], Any] = LockedLRU(SCAN_CACHE_SIZE)


def _scan(scanner, mode: str, text: str, scope: KeyScope):
    key = (scope, mode, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())
    return _scans.get_or_make(key, lambda: scanner.apply(text))


def screen_documents(
    mode: str, documents: list[InlineDocument] | None, param: str, scope: KeyScope = SHARED
) -> list[dict[str, Any]]:
    """Apply `mode` to documents in place (strip rewrites their text); returns what was found, per document.
    `scope` is the sending key's (pipelines.scope: its scans are remembered apart from other keys'). CPU work over the whole
    text: call it in a worker thread."""
    if mode == "off" or not documents:
        return []
    from pipelines.safety.injection import InjectionScanner  # the rules compile on first use, not with the app

    scanner = InjectionScanner(mode)  # type: ignore[arg-type]
    found = []
    for index, document in enumerate(documents):
        name = document.id or f"{param}[{index}]"
        # the title and the id head the document's passages in the prompt ("title (id)"): scanned like its text
        for part, text in (("text", document.text), ("title", document.title), ("id", document.id)):
            if not text:
                continue
            result = _scan(scanner, mode, text, scope)
            if not result.findings:
                continue
            # an id is a name the documents are cached and cited by: one that would need stripping is refused
            if result.blocked or (mode == "strip" and part == "id"):
                where = "" if part == "text" else f"'s {part}"
                raise GatewayError(
                    400,
                    f"document {name[:128]!r}{where} holds instruction-like text the policy blocks "
                    f"(rules: {', '.join(result.rules)})",
                    param=f"{param}[{index}]" + ("" if part == "text" else f".{part}"),
                    code="document_injection",
                )
            if mode == "strip":
                if part == "text":
                    document.text = result.kept_text
                else:
                    document.title = result.text.strip() or None
            report = result.report(name, MAX_FINDINGS_PER_DOCUMENT)
            found.append(report if part == "text" else {**report, "field": part})
    return found


def flag_headers(found: list[dict[str, Any]]) -> dict[str, str]:
    return {headers.FLAGS: INJECTION_FLAG} if found else {}


async def screen_attached(policy: Policy, chat: ChatCompletionRequest, scope: KeyScope) -> list[dict[str, Any]]:
    """The documents attached to a routed request, screened off the event loop (nothing to do without any)."""
    documents = chat.selfroute.documents if chat.selfroute else None
    if documents:  # bounded before the scan, which reads every byte
        check_documents(policy.request_limits, [d.text for d in documents], "selfroute.documents")
    if not documents or policy.security.injection == "off":
        return []
    return await anyio.to_thread.run_sync(
        screen_documents, policy.security.injection, documents, "selfroute.documents", scope
    )
