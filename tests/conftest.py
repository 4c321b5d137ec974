import logging
import os

# imported here, before any gateway starts: the gateway imports litellm (and with it httpx) in a background
# thread at start-up, and a test importing the openai client at that moment could see a half-initialised httpx
import httpx  # noqa: F401
import openai  # noqa: F401
import pytest

# Offline, always: no hub downloads, no remote litellm cost map.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
for name in (
    "SELFROUTE_API_KEYS",
    "SELFROUTE_ADMIN_KEY",
    "SELFROUTE_DATA_DIR",
    "SELFROUTE_STORE_URI",
    "OPENAI_API_BASE",
    "OPENAI_BASE_URL",
    "SELFROUTE_LEDGER_URL",
):
    os.environ.pop(name, None)

from tests.support.engines import postgres_server, postgres_url, s3_bucket, s3_server  # noqa: E402,F401  (fixtures)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_location(request, tmp_path):
    """Where a test ledger lives, once per engine: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "ledger.sqlite3"
    return request.getfixturevalue("postgres_url")


@pytest.fixture(scope="module")
def upstream():
    """(url, app) of the fake OpenAI-compatible upstream (tests/support/fake_upstream.py) on loopback."""
    from tests.support.fake_upstream import create_fake_upstream
    from tests.support.servers import serve_app

    app = create_fake_upstream()
    with serve_app(app) as url:
        yield url, app


@pytest.fixture(autouse=True)
def _restore_root_logging():
    """The root logger as it was before the test. `selfroute serve` run in-process (gateway.cli.main) sets up the
    process's logging with force=True: a handler on the sys.stderr of that moment (a capture stream that is closed
    once the test ends) and the level INFO. Left in place, every later test's log lines, the access log's among
    them, went to the closed stream ("--- Logging error --- ValueError: I/O operation on closed file")."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
