"""Retrieval (cheap route) and long-context packing (long route) over documents."""
