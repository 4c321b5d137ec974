"""Token counting with tiktoken, using the BPE files that ship inside litellm (no download)."""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path

ENCODING_NAME = "cl100k_base"


def _litellm_tokenizer_dir() -> str | None:
    # find_spec locates litellm without importing it (importing it is slow and may touch the network)
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
    return str(folder) if folder.is_dir() else None


@lru_cache(maxsize=1)
def encoding():
    """The shared tiktoken encoding; points TIKTOKEN_CACHE_DIR at litellm's copy first."""
    if not os.environ.get("TIKTOKEN_CACHE_DIR"):
        folder = _litellm_tokenizer_dir()
        if folder:
            os.environ["TIKTOKEN_CACHE_DIR"] = folder
    import tiktoken

    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    return len(encoding().encode(text, disallowed_special=()))


def truncate_tokens(text: str, max_tokens: int) -> str:
    ids = encoding().encode(text, disallowed_special=())
    return text if len(ids) <= max_tokens else encoding().decode(ids[:max_tokens])
