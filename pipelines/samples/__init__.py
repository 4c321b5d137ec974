"""A small sample shipped with selfroute so the README's quick start runs as written: three short, invented
documents of a fictional harbour (a berth lease, a pump-station manual, a safety code) with numbered
sections that refer to each other. Written for selfroute and dedicated to the public domain (CC0 1.0, see
LICENSE beside this file)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SAMPLE_COLLECTION = "harbour"


def sample_path() -> Path:
    """The folder of sample documents (what `selfroute ingest --sample` ingests)."""
    return Path(str(resources.files("pipelines.samples").joinpath(SAMPLE_COLLECTION)))
