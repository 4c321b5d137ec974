"""Routing features and the trained P(cheap route suffices) model. Pure: no I/O here."""
