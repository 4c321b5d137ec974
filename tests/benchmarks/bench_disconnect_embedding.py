"""How soon a request stops embedding its new attached documents once its client has left (round eight).

    PYTHONPATH=$PWD .venv/bin/python tests/benchmarks/bench_disconnect_embedding.py [--tree TREE] \\
        [--requests 4] [--doc-tokens 30000] [--leave-after 12] [--first-pass 0] [--wait 120]

A real `selfroute serve` (the gateway's code from TREE, default this checkout) on the fake upstream; `--requests`
clients at once, each attaching a new document of about `--doc-tokens` tokens, all from one key, each closing its
connection `--leave-after` seconds after sending. `--first-pass 0` (rag.first_pass_candidates 0, the default here)
makes every request embed its document before answering; with the policy's 16 the first 4 of one key are answered
from the first pass
while their documents are embedded in the background (on purpose: the next questions need them), and the fifth and
later embed before answering, as in probe7's run. Printed per request: its ledger status and how many seconds after
its client left its row was finished (the row is written at once; the embedding, in a worker thread, may go on);
then the gateway's CPU after the clients left: seconds until it went idle (under 10% of a core over 2 s) and CPU
seconds spent meanwhile (/proc/PID/stat), and `uptime` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.engines import free_port  # noqa: E402
from tests.support.fake_upstream import create_fake_upstream  # noqa: E402
from tests.support.policies import fake_route, write_shipped_policy  # noqa: E402
from tests.support.servers import serve_app, wait_ready  # noqa: E402


def leave_after(port: int, body: bytes, seconds: float) -> float:
    """Send the request on a raw connection, close it `seconds` later; returns when it closed (time.time())."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body)
        time.sleep(seconds)
    return time.time()


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def until_idle(pid: int, since: float, limit: float, window: float = 2.0, idle: float = 0.1) -> tuple[float, float]:
    """(seconds from `since` until the process's CPU rate over `window` fell under `idle` cores, CPU seconds it spent
    from now until then); (nan, spent) if it never did within `limit` seconds."""
    samples = [(time.time(), cpu_seconds(pid))]
    while time.time() - since < limit:
        time.sleep(0.25)
        samples.append((time.time(), cpu_seconds(pid)))
        old = [s for s in samples if s[0] <= samples[-1][0] - window]
        if old and (samples[-1][1] - old[-1][1]) / (samples[-1][0] - old[-1][0]) < idle:
            return old[-1][0] - since, old[-1][1] - samples[0][1]
    return float("nan"), samples[-1][1] - samples[0][1]


def document(n: int, tokens: int) -> str:
    sentence = f"Ledger {n} line {{i}} records that crate {{i}} of batch {n} weighs {{w}} kilograms. "
    return "".join(sentence.format(i=i, w=(i * 37 + n) % 900) for i in range(tokens // 16))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--doc-tokens", type=int, default=30000)
    parser.add_argument("--leave-after", type=float, default=12.0)
    parser.add_argument("--first-pass", type=int, default=0, help="rag.first_pass_candidates (the policy's: 16)")
    parser.add_argument("--wait", type=float, default=120.0, help="give up waiting for the rows after this long")
    args = parser.parse_args()
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-disconnect-") as tmp, serve_app(create_fake_upstream()) as base:
        root = Path(tmp)
        policy = write_shipped_policy(
            root / "policy.yaml",
            cheap=fake_route(base, "fake-cheap", context_window=128000, max_output_tokens=64),
            long=fake_route(base, "fake-long", context_window=128000, max_output_tokens=64),
            routing={"rules": [], "verifier": None, "classifier": None, "default_route": "rag"},
            rag={"first_pass_candidates": args.first_pass},
        )
        port = free_port()
        log = root / "serve.log"
        with log.open("w") as out:  # run from TREE: `python -m` puts the working directory first on the path
            process = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--policy", str(policy)]
                + ["--data-dir", str(root / "data")],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=args.tree,
                env={**os.environ, "PYTHONPATH": str(args.tree), "PYTHONUNBUFFERED": "1"},
            )
        try:
            wait_ready(process, f"http://127.0.0.1:{port}", log, timeout=300)
            left: list[float] = [0.0] * args.requests
            bodies = [
                json.dumps(
                    {
                        "model": "selfroute",
                        "messages": [{"role": "user", "content": f"What does crate 7 of batch {n} weigh?"}],
                        "selfroute": {"documents": [{"id": f"ledger-{n}", "text": document(n, args.doc_tokens)}]},
                    }
                ).encode()
                for n in range(args.requests)
            ]

            def client(n: int) -> None:
                left[n] = leave_after(port, bodies[n], args.leave_after)

            threads = [threading.Thread(target=client, args=(n,)) for n in range(args.requests)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            before_leaving = cpu_seconds(process.pid)
            idle_after, spent = until_idle(process.pid, max(left), args.wait)
            deadline = time.monotonic() + args.wait
            rows: list[tuple] = []
            while time.monotonic() < deadline:
                conn = sqlite3.connect(root / "data" / "ledger.sqlite3")
                try:
                    rows = conn.execute(
                        "SELECT status, created_at + latency_ms / 1000.0 FROM requests ORDER BY created_at"
                    ).fetchall()
                except sqlite3.OperationalError:  # not made yet
                    rows = []
                finally:
                    conn.close()
                if len(rows) >= args.requests:
                    break
                time.sleep(0.5)
            last_left = max(left)
            print(
                f"tree {args.tree}: {args.requests} requests, {args.doc_tokens} tokens each, left after "
                f"{args.leave_after:g} s, first_pass_candidates {args.first_pass}"
            )
            for status, finished in rows:
                print(f"  status {status}: row finished {finished - last_left:+.1f} s after the clients left")
            missing = args.requests - len(rows)
            if missing:
                print(f"  {missing} rows not finished {args.wait:g} s after the clients left")
            after = [finished - last_left for status, finished in rows if status == 499]
            print(
                f"  499s {len(after)} of {args.requests}; their rows at most "
                f"{max(after) if after else float('nan'):.1f} s after the clients left"
            )
            print(
                f"  the gateway went idle {idle_after:.1f} s after the clients left (nan: not within {args.wait:g} s), "
                f"having spent {spent:.1f} CPU seconds meanwhile ({before_leaving:.1f} before they left, start-up included)"
            )
        finally:
            process.terminate()
            process.wait(90)
    print("uptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
