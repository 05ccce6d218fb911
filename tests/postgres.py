"""A throwaway PostgreSQL server for tests: one cluster in a temporary directory.

``PostgresServer`` runs ``initdb`` and ``postgres`` from the machine's PostgreSQL binaries
(on PATH, or under Debian's ``/usr/lib/postgresql/VERSION/bin``), listening on 127.0.0.1
only (a free port; its unix socket in the temporary directory), with durability off
(``fsync=off`` unless asked: nothing in it must outlive the tests). ``create_database()``
hands out a fresh, empty database as a ``postgresql+psycopg://`` URL. ``stop()`` shuts the
server down and removes the directory.

For faults (on a server started ``crash_safe``): ``kill()`` stops the server at once, as
``pg_ctl stop -m immediate`` does (its clients' connections drop; nothing is
checkpointed), and ``start_again()`` brings it back on the same port with the same data.
``standby()`` makes a streaming-replication standby of a running server
(``pg_basebackup``), which the primary then waits for at every commit (synchronous
replication: nothing acknowledged is lost when the primary dies), and ``promote()`` makes a
standby the new primary.

PostgreSQL refuses to run as root, so under root the binaries run as the ``postgres`` OS
user (through util-linux's ``setpriv``, which execs in place: the process started is the
server itself) with the directory handed to that user. The server gets SIGINT (its fast
shutdown) if the test process dies without stopping it.

One server serves a whole test session: ``shared()`` starts it on first use (the
``postgres`` fixture in ``tests/conftest.py`` and ``tests.server.factories`` both use it)
and it is stopped at exit.
"""

from __future__ import annotations

import atexit
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg

USER = "ffdl"
# Authentication is "trust" on 127.0.0.1: the password is only there so that URLs look like
# real ones (and tests can check that no message ever shows it).
PASSWORD = "not-a-secret"
START_TIMEOUT_S = 60.0


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_binaries() -> Path:
    """The directory holding ``initdb`` and ``postgres``: PATH first, then Debian's."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: [int(part) for part in path.split("/")[4].split(".") if part.isdigit()],
    )
    if candidates:
        return Path(candidates[-1]).parent
    raise PostgresMissing(
        "the tests need a PostgreSQL server, but initdb and postgres are neither on PATH "
        "nor under /usr/lib/postgresql/*/bin; install it (Debian: apt-get install postgresql)"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster on 127.0.0.1, alive between ``start()`` and ``stop()``."""

    def __init__(self, *, fsync: bool = False, crash_safe: bool = False) -> None:
        """``fsync=True`` keeps PostgreSQL's durability (for benchmarks beside SQLite's
        ``synchronous=FULL``); tests run without it. ``crash_safe=True`` keeps commits
        synchronous: what a commit acknowledged survives ``kill()`` (the operating system
        still holds it) and is on a ``standby()``."""
        self.fsync = fsync
        self.crash_safe = crash_safe
        # More ``-c name=value`` settings for the server's command line.
        self.options: list[str] = []
        self.bin = find_binaries()
        self.root = Path(tempfile.mkdtemp(prefix="ffdl-pg-"))
        self.data = self.root / "data"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)
        self._lock = threading.Lock()

    def _durability(self) -> list[str]:
        if self.fsync:
            return []
        unsafe = ["-c", "fsync=off", "-c", "full_page_writes=off"]
        return unsafe if self.crash_safe else [*unsafe, "-c", "synchronous_commit=off"]

    def _as_owner(self) -> list[str]:
        """The command prefix that runs PostgreSQL's binaries: as the ``postgres`` user when
        root, and (from the main thread) killed with this process, even one killed outright."""
        setpriv = shutil.which("setpriv")
        root = os.geteuid() == 0
        if root:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresMissing(
                    "running as root and there is no 'postgres' OS user for the test server "
                    "(PostgreSQL refuses to run as root); Debian's postgresql package makes it"
                ) from None
            if setpriv is None:
                raise PostgresMissing(
                    "running as root, the test PostgreSQL server runs as the 'postgres' user "
                    "through setpriv, which is missing (Debian: apt-get install util-linux)"
                )
        if setpriv is None:
            return []
        prefix = [setpriv]
        if root:
            prefix += ["--reuid=postgres", "--regid=postgres", "--init-groups"]
        # The parent-death signal comes when the starting *thread* ends: only the main
        # thread lives as long as the process.
        if threading.current_thread() is threading.main_thread():
            prefix.append("--pdeathsig=SIGINT")
        return [*prefix, "--"]

    def _own_root(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.root.chmod(0o700)

    def start(self) -> PostgresServer:
        self._own_root()
        initdb = subprocess.run(
            [
                *self._as_owner(),
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed ({initdb.returncode}): {initdb.stderr.strip()}")
        self.port = free_port()
        self._launch()
        return self

    def _launch(self) -> None:
        log = (self.root / "postgres.log").open("ab")
        self.process = subprocess.Popen(
            [
                *self._as_owner(),
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.root}",
                *self._durability(),
                "-c",
                "max_connections=300",
                *self.options,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self._wait_ready()

    def kill(self) -> None:
        """Stop at once, as ``pg_ctl stop -m immediate`` (SIGQUIT): connections drop."""
        self._end(signal.SIGQUIT)

    def _end(self, sig: signal.Signals) -> None:
        """Send the server ``sig`` and wait for it to exit (SIGKILL after 30 s)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def start_again(self) -> None:
        """After ``kill()``: the same server, port and data, back (crash recovery first)."""
        assert self.process is None, "the server is running"
        self._launch()

    def standby(self) -> PostgresServer:
        """A new server streaming this one's changes, synchronously (see the module)."""
        assert self.crash_safe, "a primary is started with crash_safe=True"
        replica = PostgresServer(fsync=self.fsync, crash_safe=True)
        replica._own_root()
        backup = subprocess.run(
            [
                *replica._as_owner(),
                str(replica.bin / "pg_basebackup"),
                "--pgdata",
                str(replica.data),
                f"--dbname=host=127.0.0.1 port={self.port} user={USER}",
                "--write-recovery-conf",
                "--wal-method=stream",
                "--checkpoint=fast",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if backup.returncode != 0:
            replica.stop()
            raise RuntimeError(f"pg_basebackup failed: {backup.stderr.strip()}")
        replica.port = free_port()
        # After the primary restarts, commits wait for the standby to reconnect: it retries
        # every 5 s by default, which would be most of a short outage's cost.
        replica.options = ["-c", "wal_retrieve_retry_interval=500ms"]
        replica._launch()
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
                ).fetchone()
                if row is not None and row[0] >= 1:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby never became a synchronous standby")
                time.sleep(0.05)  # polling the primary's view of its standby
        return replica

    def promote(self) -> None:
        """Make this standby a primary that accepts writes."""
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute("SELECT pg_promote(wait => true)")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited at start: {self.log_tail()}")
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                last = exc
                time.sleep(0.05)  # polling the server's readiness, not synchronising
        raise RuntimeError(f"postgres not ready in {START_TIMEOUT_S:g} s: {last}")

    def log_tail(self) -> str:
        try:
            return (self.root / "postgres.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={USER} dbname={database}"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "ffdl") -> str:
        """A new empty database; its SQLAlchemy URL."""
        with self._lock:
            name = f"{prefix}_{next(self._names)}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        # SIGINT: PostgreSQL's fast shutdown (disconnects clients, no checkpoint wait).
        self._end(signal.SIGINT)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


_shared: PostgresServer | None = None
_shared_lock = threading.Lock()


def shared() -> PostgresServer:
    """This test process's one server, started on first use and stopped at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            server = PostgresServer()
            try:
                server.start()
            except BaseException:
                server.stop()
                raise
            atexit.register(server.stop)
            _shared = server
        return _shared


def stop_shared() -> None:
    global _shared
    with _shared_lock:
        server, _shared = _shared, None
    if server is not None:
        server.stop()
