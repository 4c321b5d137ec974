import anyio

from pipelines.cancellation import cancel_scope, cancelled


def test_worker_threads_see_their_request_cancelled():
    seen: list[bool] = []

    async def main() -> None:
        assert not cancelled()  # outside any request
        with cancel_scope() as stop:
            seen.append(await anyio.to_thread.run_sync(cancelled))
            stop.set()
            seen.append(await anyio.to_thread.run_sync(cancelled))
        with cancel_scope():  # another request's scope is its own
            seen.append(await anyio.to_thread.run_sync(cancelled))

    anyio.run(main)
    assert seen == [False, True, False]
