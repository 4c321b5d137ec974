"""The learning tests' gateway: started per policy, stopped (its shutdown included) at the end of the test."""

import pytest


@pytest.fixture()
def gateway(upstream, embedder, tmp_path):
    """gateway(policy) -> (url, app), stopped (shutdown included) at the end of the test or by stop()."""
    from gateway.server.app import create_app
    from gateway.settings import Settings
    from tests.support.servers import serve_app

    running = []
    upstream[1].state.received.clear()
    upstream[1].state.judge_reply = '{"verdict": "worse"}'

    def start(policy, name="g"):
        app = create_app(Settings(data_dir=tmp_path / name), policy=policy, embedder=embedder)
        server = serve_app(app)
        url = server.__enter__()
        running.append(server)
        return url, app, server

    yield start
    for server in running:
        server.__exit__(None, None, None)
