"""Routing policy schema and the shipped YAML policies."""
