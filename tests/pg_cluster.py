"""A throwaway PostgreSQL server for the test suite.

The PostgreSQL integration tests must run against a real server (no mocks of
the database), yet ``make test`` must work on a fresh machine with nothing
running and must never touch a developer's own databases. So the suite creates
its own cluster: a fresh data directory in a temp folder, trust
authentication, a free TCP port on 127.0.0.1 and ``fsync=off`` for speed
(durability of test data does not matter). Everything is removed again on
``stop()``.

Usage::

    with PostgresCluster() as pg:
        url = pg.create_database("flask_defer_test")
        ...
        pg.restart()  # e.g. to check that workers survive a server restart

The server binaries come from the Debian ``postgresql`` package; run
``scripts/ensure-system-deps`` to install them.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["PostgresCluster"]

#: How long to wait for the server to accept connections after a start.
START_TIMEOUT_SECONDS = 30.0

_INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found. "
    "Run scripts/ensure-system-deps to install them "
    "(Debian package 'postgresql')."
)


def _find_bindir() -> Path:
    """Return the directory holding ``initdb`` and ``pg_ctl``.

    Debian keeps the server binaries out of ``PATH`` (under
    ``/usr/lib/postgresql/<major>/bin``), so ``pg_config --bindir`` is asked
    first and the Debian layout globbed as a fallback, newest major first.
    """
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            out = ""
        if out:
            candidates.append(Path(out))

    def major(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else -1

    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True):
        candidates.append(Path(found))

    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    raise RuntimeError(_INSTALL_HINT)


def _free_port() -> int:
    """Ask the kernel for a free TCP port on 127.0.0.1.

    There is a small window between closing this socket and the server
    binding the port, which is acceptable for tests and far better than a
    fixed port that collides with a developer's own server or a parallel run.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PostgresCluster:
    """A private PostgreSQL server living in a temporary directory.

    ``initdb`` and ``pg_ctl`` refuse to run as root, so when the tests run as
    root (CI containers) the commands are run as the ``postgres`` system user
    through ``runuser`` and the temp directory is handed to that user.
    """

    def __init__(self, *, durable: bool = False) -> None:
        #: ``durable=True`` keeps PostgreSQL's defaults (fsync, full page writes), as
        #: users run it: what a benchmark must measure. Tests turn both off for speed.
        self.durable = durable
        self._bindir: Path | None = None
        self._tmpdir: Path | None = None
        self._port: int | None = None
        self._running = False
        self._as_postgres_user = os.geteuid() == 0

    # -- public API -------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port on 127.0.0.1 (fixed for the cluster's lifetime)."""
        if self._port is None:
            raise RuntimeError("PostgresCluster has not been started")
        return self._port

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the default ``postgres`` database."""
        return self._url_for("postgres")

    @property
    def running(self) -> bool:
        """Whether the server is currently started by this object."""
        return self._running

    def start(self) -> None:
        """Initialise the cluster on first use, then start the server.

        Returns once the server accepts connections. Calling it while the
        server is running does nothing. After ``stop()`` a new, empty cluster
        is created.
        """
        if self._running:
            return
        if self._tmpdir is None:
            self._init_cluster()
        self._pg_ctl_start()
        self._running = True
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete the temp directory.

        Idempotent, and also registered with ``atexit`` so an aborted test
        session does not leave a postmaster behind.
        """
        atexit.unregister(self.stop)
        try:
            # Also covers a server left up by a failed restart().
            if self._tmpdir is not None and (self._datadir / "postmaster.pid").exists():
                self._pg_ctl_stop()
        finally:
            self._running = False
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
            self._port = None

    def restart(self) -> None:
        """Stop the server with a fast shutdown and start it again.

        Same data directory and same port, so clients holding the URL can
        reconnect; their existing connections are cut, which is the point
        of the worker-reliability test that uses this.
        """
        if not self._running:
            raise RuntimeError("PostgresCluster is not running")
        self._pg_ctl_stop()
        self._running = False
        self._pg_ctl_start()
        self._running = True

    def crash(self) -> None:
        """Kill the server as a crash would (``pg_ctl stop -m immediate``), then start it.

        No shutdown checkpoint and no flush of the WAL buffers: commits that did not
        wait for the WAL flush (``synchronous_commit`` off) within the last moments may
        be gone after the crash recovery, as after a power loss.
        """
        if not self._running:
            raise RuntimeError("PostgresCluster is not running")
        self._pg_ctl_stop("immediate")
        self._running = False
        self._pg_ctl_start()
        self._running = True

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its SQLAlchemy URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self._libpq_dsn("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self._url_for(name)

    def __enter__(self) -> PostgresCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<PostgresCluster port={self._port} {state}>"

    # -- internals --------------------------------------------------------

    def _url_for(self, dbname: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def _libpq_dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    @property
    def _datadir(self) -> Path:
        assert self._tmpdir is not None
        return self._tmpdir / "data"

    @property
    def _logfile(self) -> Path:
        assert self._tmpdir is not None
        return self._tmpdir / "postgres.log"

    def _run(self, args: list[str], what: str) -> None:
        """Run a server tool, as the postgres user when we are root."""
        assert self._tmpdir is not None
        cmd = list(args)
        if self._as_postgres_user:
            runuser = shutil.which("runuser")
            if runuser is None:
                raise RuntimeError(
                    "running as root, but 'runuser' is missing to run "
                    "PostgreSQL as the 'postgres' user"
                )
            cmd = [runuser, "-u", "postgres", "--", *cmd]
        # cwd inside the temp dir: the postgres user may not be allowed to
        # enter the caller's working directory (e.g. /root).
        result = subprocess.run(
            cmd,
            cwd=self._tmpdir,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{what} failed (exit {result.returncode}):\n"
                f"{result.stdout}{result.stderr}{self._log_tail()}"
            )

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self._logfile.read_text(errors="replace")
        except OSError:
            return ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f"\n--- server log ({self._logfile}) ---\n{tail}"

    def _init_cluster(self) -> None:
        self._bindir = _find_bindir()
        self._tmpdir = Path(tempfile.mkdtemp(prefix="flask-defer-pg-"))
        self._port = _free_port()
        try:
            if self._as_postgres_user:
                shutil.chown(self._tmpdir, user="postgres", group="postgres")
            self._run(
                [
                    str(self._bindir / "initdb"),
                    "-D",
                    str(self._datadir),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "--no-instructions",
                ],
                "initdb",
            )
            # Appended to the file initdb wrote (which keeps its owner), so
            # restarts pick the same settings up without extra options.
            settings = {
                "listen_addresses": "'127.0.0.1'",
                "port": str(self._port),
                "unix_socket_directories": f"'{self._tmpdir}'",
                "max_connections": "200",
            }
            if not self.durable:
                settings.update(fsync="off", full_page_writes="off")
            with (self._datadir / "postgresql.conf").open("a") as conf:
                conf.write("\n# throwaway test cluster\n")
                for key, value in settings.items():
                    conf.write(f"{key} = {value}\n")
        except BaseException:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
            self._port = None
            raise

    def _pg_ctl(self) -> str:
        assert self._bindir is not None
        return str(self._bindir / "pg_ctl")

    def _pg_ctl_start(self) -> None:
        self._run(
            [
                self._pg_ctl(),
                "start",
                "-D",
                str(self._datadir),
                "-l",
                str(self._logfile),
                "-w",
                "-t",
                str(int(START_TIMEOUT_SECONDS)),
            ],
            "pg_ctl start",
        )
        self._wait_ready()

    def _pg_ctl_stop(self, mode: str = "fast") -> None:
        self._run(
            [self._pg_ctl(), "stop", "-D", str(self._datadir), "-m", mode, "-w"],
            "pg_ctl stop",
        )

    def _wait_ready(self) -> None:
        """Wait until a TCP connection on 127.0.0.1 is accepted.

        ``pg_ctl -w`` may check readiness over the unix socket; the tests
        connect over TCP, so check that path explicitly.
        """
        assert self._bindir is not None
        pg_isready = self._bindir / "pg_isready"
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if pg_isready.is_file():
                ready = (
                    subprocess.run(
                        [
                            str(pg_isready),
                            "-q",
                            "-h",
                            "127.0.0.1",
                            "-p",
                            str(self.port),
                            "-U",
                            "postgres",
                            "-d",
                            "postgres",
                        ],
                        check=False,
                    ).returncode
                    == 0
                )
            else:
                ready = self._can_connect()
            if ready:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"PostgreSQL did not accept connections on 127.0.0.1:{self.port} "
                    f"within {START_TIMEOUT_SECONDS:.0f}s{self._log_tail()}"
                )
            time.sleep(0.1)

    def _can_connect(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self._libpq_dsn("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False
