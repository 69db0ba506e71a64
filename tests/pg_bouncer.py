"""A throwaway PgBouncer in transaction mode, in front of the test suite's PostgreSQL.

Managed PostgreSQL (Supabase, Neon, Heroku, RDS Proxy) hands apps a pooled URL in
transaction mode: each transaction may run on another server connection, so session
state (a LISTEN, a prepared statement) does not carry over. The pooler tests run
through a real PgBouncer (Debian's package, installed by ``scripts/ensure-system-deps``)
set up that way: trust authentication, a free port on 127.0.0.1, every database of the
server behind it. As root (CI) it runs as the ``postgres`` user, as the server does.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import make_url

__all__ = ["PgBouncer"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary() -> str:
    found = shutil.which("pgbouncer")
    if found is None and Path("/usr/sbin/pgbouncer").exists():
        found = "/usr/sbin/pgbouncer"  # Debian's, outside a non-root PATH
    if found is None:
        raise RuntimeError("pgbouncer is not installed: run scripts/ensure-system-deps")
    return found


class PgBouncer:
    """One PgBouncer process in transaction mode in front of *server_url*'s server."""

    def __init__(self, server_url: str) -> None:
        url = make_url(server_url)
        self.server_host = url.host or "127.0.0.1"
        self.server_port = url.port or 5432
        self.user = url.username or "postgres"
        self.port = _free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="flask-defer-pgbouncer-"))
        self._process: subprocess.Popen[bytes] | None = None

    def pooled(self, direct_url: str) -> str:
        """*direct_url* (a database of the server) through the pooler instead."""
        url = make_url(direct_url)
        return url.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def start(self) -> None:
        (self._dir / "users.txt").write_text(f'"{self.user}" ""\n')
        config = self._dir / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self._dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 200\n"
            "default_pool_size = 10\n"
            "server_reset_query =\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self._dir / 'pgbouncer.log'}\n"
        )
        command = [_binary(), str(config)]
        if os.geteuid() == 0:
            shutil.chown(self._dir, user="postgres", group="postgres")
            for path in self._dir.iterdir():
                shutil.chown(path, user="postgres", group="postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        self._process = subprocess.Popen(  # noqa: S603 - our own binary and config
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._dir
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not start: {self.log()}")

    def log(self) -> str:
        path = self._dir / "pgbouncer.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        self._process = None
        shutil.rmtree(self._dir, ignore_errors=True)
