"""OpenAI-compatible HTTP gateway that routes each request to a cheap RAG or a long-context model."""
