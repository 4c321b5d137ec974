"""Fixtures of the command tests."""

import pytest

from tests.support.routing import write_paired_fixture


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory):
    """`eval replay` arguments on the paired fixture (a paired file, documents, a data dir), and where it writes."""
    folder = tmp_path_factory.mktemp("replay")
    paired, docs = write_paired_fixture(folder)
    data_dir = folder / "data"
    plot = folder / "curve.png"
    args = [
        "eval",
        "replay",
        "--data",
        str(paired),
        "--docs",
        str(docs),
        "--folds",
        "3",
        "--prices",
        "reference",
        "--estimator",
        "logistic",
        "--data-dir",
        str(data_dir),
        "--log-level",
        "WARNING",
    ]
    return {"args": args, "plot": plot, "data_dir": data_dir, "folder": folder}
