"""Real shared engines for tests: a throwaway PostgreSQL server and an S3-compatible server (moto).

Import the fixtures into a conftest (``from tests.support.engines import postgres_server, postgres_url, s3_server,
s3_bucket``) or into a test module. Both servers listen on 127.0.0.1 only, start once per session, and are
stopped (and their files removed) at the end. When an engine is not installed the tests that use it are
skipped with a message naming the fix: ``bash .ci/install --test``.

PostgreSQL runs as the ``postgres`` user (``runuser -u postgres --``, or ``su postgres -c``) when the tests run
as root, since the server refuses to run as root; otherwise as the current user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

INSTALL_HINT = "install it with `bash .ci/install --test`"
_PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"


# --------------------------------------------------------------------------------------------- PostgreSQL


def find_postgres_bin() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin that has initdb and pg_ctl (Debian's layout), else None."""
    found = []
    for path in glob.glob(_PG_BIN_GLOB):
        bindir = Path(path)
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            version = bindir.parent.name
            found.append((int(version) if version.isdigit() else 0, bindir))
    return max(found)[1] if found else None


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_postgres_prefix() -> list[str] | None:
    """argv prefix that runs a command as the postgres user (None: run it as ourselves)."""
    if os.geteuid() != 0:
        return None
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--"]
    return ["su", "postgres", "-s", "/bin/sh", "-c"]  # the command follows as one shell string


@dataclass
class PostgresServer:
    """A running throwaway server; ``url(dbname)`` builds a libpq URL, ``create_database()`` a fresh database."""

    host: str
    port: int
    user: str
    root: Path  # temp dir: data/, the unix socket, server.log
    bindir: Path
    _prefix: list[str] | None = field(default=None, repr=False)
    _databases: list[str] = field(default_factory=list, repr=False)

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        return self.root / "server.log"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres", **kwargs):
        import psycopg

        return psycopg.connect(self.url(dbname), **kwargs)

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database (``db_<random>`` unless named) and return its URL."""
        name = name or f"db_{uuid.uuid4().hex[:12]}"
        with self.connect(autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self._databases.append(name)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with self.connect(autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    # -- process control

    def run(self, *argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a PostgreSQL binary (as the postgres user when we are root)."""
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if self._prefix is not None:
            if self._prefix[0] == "su":
                cmd = [*self._prefix, shlex.join(cmd)]
            else:
                cmd = [*self._prefix, *cmd]
        # cwd: the server user may not be able to read the repository's directory
        proc = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            log = self.logfile.read_text(errors="replace")[-4000:] if self.logfile.exists() else ""
            raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{log}")
        return proc

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
        )
        self.run("pg_ctl", "-D", str(self.datadir), "-l", str(self.logfile), "-o", options, "-w", "-t", "60", "start")
        self.wait_ready()

    def wait_ready(self, timeout: float = 180) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.connect(connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        if (self.datadir / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.datadir), "-m", "fast", "-w", "-t", "60", "stop", check=False)


def start_postgres() -> PostgresServer:
    """Start a server in a fresh temp dir, or pytest.skip when PostgreSQL or psycopg is missing."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip(f"psycopg (psycopg[binary]) is not installed: {INSTALL_HINT}")
    bindir = find_postgres_bin()
    if bindir is None:
        pytest.skip(
            f"PostgreSQL server binaries (initdb, pg_ctl) not found under {_PG_BIN_GLOB}: {INSTALL_HINT}"
            " (Debian package `postgresql`)"
        )
    prefix = _as_postgres_prefix()
    root = Path(tempfile.mkdtemp(prefix="selfroute-pg-"))
    if prefix is not None:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip(f"running as root but there is no `postgres` user to run the server: {INSTALL_HINT}")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    os.chmod(root, 0o700)
    server = PostgresServer(host="127.0.0.1", port=0, user="postgres", root=root, bindir=bindir, _prefix=prefix)
    try:
        server.run(
            "initdb",
            "-D",
            str(server.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        for attempt in range(3):  # the free port can be taken between picking and binding it
            server.port = free_port()
            try:
                server.start()
                break
            except RuntimeError:
                server.stop()
                if attempt == 2:
                    raise
    except BaseException:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    return server


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server for the session (trust auth, 127.0.0.1, random port), stopped and removed after."""
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server):
    """URL of a fresh, empty database for this test (dropped afterwards)."""
    url = postgres_server.create_database()
    yield url
    try:
        postgres_server.drop_database(url.rsplit("/", 1)[1])
    except Exception:  # a leaked connection must not fail the test; the whole server goes at session end
        pass


# --------------------------------------------------------------------------------------------- S3 (moto)


@dataclass
class S3Server:
    endpoint_url: str
    region: str = "us-east-1"
    access_key_id: str = "testing"
    secret_access_key: str = "testing"

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )


@dataclass
class S3Location:
    """A fresh bucket and prefix on the test S3 server, with the settings a client needs to reach it."""

    server: S3Server
    bucket: str
    prefix: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def endpoint_url(self) -> str:
        return self.server.endpoint_url

    @property
    def storage_options(self) -> dict[str, str]:
        """For LanceDB / Lance / object_store: ``lancedb.connect(uri, storage_options=...)``."""
        return {
            "endpoint": self.server.endpoint_url,
            "aws_access_key_id": self.server.access_key_id,
            "aws_secret_access_key": self.server.secret_access_key,
            "region": self.server.region,
            "allow_http": "true",
        }

    @property
    def env(self) -> dict[str, str]:
        """The same as environment variables (set them with monkeypatch.setenv; nothing here sets them)."""
        return {
            "AWS_ENDPOINT_URL": self.server.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.server.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.server.secret_access_key,
            "AWS_DEFAULT_REGION": self.server.region,
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self):
        return self.server.client()


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 (and the rest of AWS) in server mode on 127.0.0.1, a random port, for the session."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        pytest.skip(f"moto[server] is not installed: {INSTALL_HINT}")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Server(endpoint_url=f"http://{host}:{port}")
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket; yields an S3Location (``.uri`` is ``s3://bucket/prefix``, plus storage_options and env)."""
    try:
        import boto3  # noqa: F401
    except ImportError:
        pytest.skip(f"boto3 is not installed: {INSTALL_HINT}")
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    s3_server.client().create_bucket(Bucket=bucket)
    yield S3Location(server=s3_server, bucket=bucket, prefix="selfroute")
