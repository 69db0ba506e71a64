"""Configuration: every ``DEFER_*`` key, its default, and the frozen object built from them.

``init_app`` calls :func:`apply_defaults` once and :func:`load_config` once; the rest of
the code reads the resulting :class:`DeferConfig` and never ``current_app.config``.
Durations accept a ``timedelta`` or seconds and are normalised here. The policies the
engine runs by (retry backoff, maintenance, worker options) are derived from the
config here too, in one place, so no engine module reads a ``DEFER_*`` name.

Over 400 lines because it is one table: every setting, its default, the comment the
configuration page is rendered from, and its check, side by side (the scheduled-HTTP
settings' own checks are :mod:`.http`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..errors import InvalidArgument
from ..timeutil import as_duration
from .http import IPNetwork, allowed_networks, header_secrets, webhook_secrets

#: Every setting with its default. The README's configuration table mirrors this.
DEFAULTS: dict[str, Any] = {
    # Where jobs live when Defer is given no Flask-SQLAlchemy ``db`` (None: a SQLite
    # file ``defer.sqlite3`` in the app's instance folder).
    "DEFER_DATABASE_URI": None,
    # PostgreSQL behind a transaction-mode pooler (PgBouncer, Supavisor, Neon's pooled
    # URL): a direct connection's URL for the worker's LISTEN, which a pooler cannot
    # carry (None: the app's own URL).
    "DEFER_LISTEN_DATABASE_URI": None,
    # Attempts before a failing job becomes a dead letter (handlers may override).
    "DEFER_MAX_ATTEMPTS": 5,
    # Exponential backoff: first retry after about this long, doubling up to the cap.
    "DEFER_RETRY_BASE": timedelta(seconds=2),
    "DEFER_RETRY_CAP": timedelta(hours=1),
    # A due job whose handler this worker does not know waits this long, then retries.
    "DEFER_UNKNOWN_BACKOFF": timedelta(seconds=30),
    # How long a claim is valid without a heartbeat; a crashed worker's job returns
    # to pending this long after its last heartbeat.
    "DEFER_LEASE": timedelta(seconds=30),
    # Most jobs claimed per round trip (run_due's batch; a worker claims at most one
    # per idle handler thread, so every job it claims starts at once).
    "DEFER_CLAIM_BATCH": 50,
    # SQLite: how long a writer waits for the database lock before giving up.
    "DEFER_SQLITE_BUSY_TIMEOUT": timedelta(seconds=10),
    # SQLite: PRAGMA synchronous on every connection of the app's engine. None leaves
    # SQLite's own (FULL: a commit is on disk when it returns); "NORMAL" in WAL mode
    # skips the fsync of each commit: nothing is lost when the app crashes, but the
    # last commits can be lost when the machine loses power (docs/storage.md).
    "DEFER_SQLITE_SYNCHRONOUS": None,
    # The UI shows Undo this much shorter than the server waits, so a click in the
    # last moment still lands.
    "DEFER_UNDO_MARGIN": timedelta(seconds=1),
    # Default Undo window of defer.undoable().
    "DEFER_UNDO_WINDOW": timedelta(seconds=5),
    # Hovering or focusing a toast holds its countdown and pushes the job later; at
    # most this much extension per job in total (WCAG 2.2.1, Timing Adjustable).
    "DEFER_UNDO_MAX_HOLD": timedelta(seconds=60),
    # Settled rows are pruned after these ages (done/cancelled, and failed).
    "DEFER_RETENTION": timedelta(days=7),
    "DEFER_FAILED_RETENTION": timedelta(days=30),
    # Keep every state change of a job (who, when, which attempt, its error) in the
    # history table, pruned with its job. False: the jobs table alone.
    "DEFER_HISTORY": True,
    # Longest payload a job may carry, in bytes of its JSON text in UTF-8 (a batch item
    # too); a larger one is refused with InvalidArgument before anything is written.
    "DEFER_MAX_PAYLOAD_BYTES": 1_000_000,
    # Refuse a run_at whose local time a DST change makes ambiguous or skips, instead
    # of reading it with Python's fold=0 rule (see "Time" in docs/api.md).
    "DEFER_STRICT_LOCAL_TIMES": False,
    # -- Undo UI (blueprint) --
    # Where the blueprint's pages, fragments and assets are mounted.
    "DEFER_URL_PREFIX": "/defer",
    # At most this many Undo toasts are shown at once (the newest).
    "DEFER_TOAST_LIMIT": 5,
    # -- helpers (soft delete, batching, HTTP) --
    # Hosts defer.schedule_http() may call: None allows any host; otherwise a list of
    # host names, where "*.example.com" also allows every subdomain of example.com.
    "DEFER_HTTP_ALLOWED_HOSTS": None,
    # Default timeout of a scheduled HTTP call, and the longest one a call may ask for.
    "DEFER_HTTP_TIMEOUT": timedelta(seconds=10),
    # Networks a scheduled HTTP call may connect to although they are not public
    # (loopback, private, link-local ...), e.g. ["10.20.0.0/16"]. Every address a host
    # resolves to is checked when the call runs; other non-public ones are refused.
    "DEFER_HTTP_ALLOWED_NETWORKS": None,
    # Header values by name, for headers={"Authorization": secret("name")}: looked up
    # when the call runs, never stored in the job.
    "DEFER_HTTP_SECRETS": None,
    # Standard Webhooks signing secrets by name ("whsec_..."), for schedule_http(sign=
    # "name"); a list signs with each (rotation: the current secret and the next).
    "DEFER_WEBHOOK_SECRETS": None,
    # -- recurring schedules (defer.recurring) --
    # catch_up="all": at most this many missed ticks of one schedule run after
    # downtime (the newest); older ones are dropped with a warning.
    "DEFER_RECURRING_MAX_CATCH_UP": 100,
    # A schedule no running code declares (removed from the code, or only declared by
    # a release not deployed yet) is left alone this long, then orphaned: it stops
    # ticking. Code that does not declare a schedule never stops it before that, so a
    # rolling deploy keeps every schedule ticking. 0 orphans at once (not deploy-safe).
    "DEFER_SCHEDULE_ORPHAN_GRACE": timedelta(hours=24),
    # -- the worker (``flask defer worker``) ---------------------------------------
    # Handler threads per worker process (--concurrency); a claim takes one per idle one.
    "DEFER_WORKER_CONCURRENCY": 20,
    # async def handlers running at once on a worker's event loop (they hold no thread).
    "DEFER_ASYNC_CONCURRENCY": 100,
    # How long a handler may run when its ``@defer.job(timeout=...)`` says nothing;
    # past it the attempt counts as failed and the worker stops waiting for it.
    "DEFER_JOB_TIMEOUT": timedelta(minutes=10),
    # Longest idle sleep between looks at the table. On PostgreSQL a NOTIFY wakes the
    # worker sooner, and it always wakes exactly at the next job's run_at.
    "DEFER_MAX_SLEEP": timedelta(seconds=10),
    # Handlers' outcomes are written in batches, at least this often (0: every loop
    # round). A worker killed inside this window re-runs those jobs after their lease.
    "DEFER_ACK_FLUSH": timedelta(milliseconds=5),
    # SQLite (and PostgreSQL while its LISTEN connection is down): how often the
    # worker looks for newly scheduled jobs. A job due at a time already known to
    # the worker starts on time regardless.
    "DEFER_POLL_INTERVAL": timedelta(milliseconds=500),
    # On SIGTERM/SIGINT running handlers get this long to finish before their jobs
    # are released back to pending.
    "DEFER_SHUTDOWN_GRACE": timedelta(seconds=30),
    # How often one worker returns jobs with lapsed leases to pending.
    "DEFER_RECLAIM_INTERVAL": timedelta(seconds=5),
    # How often one worker prunes settled rows past DEFER_RETENTION.
    "DEFER_PRUNE_INTERVAL": timedelta(hours=1),
    # Development: run a worker thread inside the web process (``flask run``), once,
    # in the process that serves requests (the reloader's child).
    "DEFER_EMBEDDED_WORKER": False,
    # -- the operator dashboard and metrics ------------------------------------------
    # Jobs per page of the dashboard's list.
    "DEFER_DASHBOARD_PAGE_SIZE": 50,
    # How often an open dashboard refreshes its figures and list (0: never by itself).
    "DEFER_DASHBOARD_REFRESH": timedelta(seconds=5),
    # The dashboard's link back to the application (a URL or path; None: no link).
    "DEFER_DASHBOARD_HOME_URL": "/",
    # Serve Prometheus metrics at DEFER_URL_PREFIX + "/metrics" (needs the
    # ``flask-defer-jobs[metrics]`` extra, i.e. prometheus_client).
    "DEFER_METRICS": False,
    # Serve the metrics without the dashboard's authorisation hook (for a scraper on
    # a private network that cannot log in).
    "DEFER_METRICS_PUBLIC": False,
    # The CSP frame-ancestors sent with every page of the blueprint: who may show
    # the dashboard and the Undo pages in a frame (clickjacking). None sends no header.
    "DEFER_FRAME_ANCESTORS": "'self'",
}

_DURATIONS = {name for name, value in DEFAULTS.items() if isinstance(value, timedelta)}


#: The values of SQLite's ``PRAGMA synchronous`` that ``DEFER_SQLITE_SYNCHRONOUS`` takes.
SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def apply_defaults(config: MutableMapping[str, Any]) -> None:
    """Set every ``DEFER_*`` default the app has not set itself."""
    for name, value in DEFAULTS.items():
        config.setdefault(name, value)


@dataclass(frozen=True, slots=True)
class DeferConfig:
    """The app's flask_defer settings, read once at ``init_app``."""

    database_uri: str | None
    listen_database_uri: str | None
    max_attempts: int
    retry_base: timedelta
    retry_cap: timedelta
    unknown_backoff: timedelta
    lease: timedelta
    claim_batch: int
    sqlite_busy_timeout: timedelta
    sqlite_synchronous: str | None
    undo_margin: timedelta
    undo_window: timedelta
    undo_max_hold: timedelta
    retention: timedelta
    failed_retention: timedelta
    history: bool
    max_payload_bytes: int
    strict_local_times: bool
    # -- Undo UI (blueprint) --
    url_prefix: str
    toast_limit: int
    # -- helpers --
    http_allowed_hosts: frozenset[str] | None
    http_timeout: timedelta
    http_allowed_networks: tuple[IPNetwork, ...]
    # Out of the repr, so a logged config shows no secret.
    http_secrets: Mapping[str, str] = field(repr=False, hash=False)
    webhook_secrets: Mapping[str, tuple[bytes, ...]] = field(repr=False, hash=False)
    # -- recurring schedules --
    recurring_max_catch_up: int
    schedule_orphan_grace: timedelta
    # -- the worker --
    worker_concurrency: int
    async_concurrency: int
    job_timeout: timedelta
    max_sleep: timedelta
    ack_flush: timedelta
    poll_interval: timedelta
    shutdown_grace: timedelta
    reclaim_interval: timedelta
    prune_interval: timedelta
    embedded_worker: bool
    # -- the operator dashboard and metrics --
    dashboard_page_size: int
    dashboard_refresh: timedelta
    dashboard_home_url: str | None
    metrics: bool
    metrics_public: bool
    frame_ancestors: str | None

    def retry_policy(self) -> RetryPolicy:
        """The executor's backoff settings."""
        return RetryPolicy(
            base=self.retry_base, cap=self.retry_cap, unknown_backoff=self.unknown_backoff
        )

    def maintenance_policy(self) -> MaintenancePolicy:
        """How often workers reclaim and prune, and the retention of settled rows."""
        return MaintenancePolicy(
            reclaim_interval=self.reclaim_interval,
            prune_interval=self.prune_interval,
            retention=self.retention,
            failed_retention=self.failed_retention,
        )

    def worker_options(
        self,
        *,
        concurrency: int | None = None,
        queues: Collection[str] | None = None,
        burst: bool = False,
    ) -> WorkerOptions:
        """A worker's options from this config; explicit arguments win."""
        return WorkerOptions.from_config(self, concurrency=concurrency, queues=queues, burst=burst)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long to wait before trying again, from the app's configuration."""

    base: timedelta
    cap: timedelta
    unknown_backoff: timedelta


@dataclass(frozen=True, slots=True)
class MaintenancePolicy:
    """How often to reclaim and prune, and how long settled rows are kept."""

    reclaim_interval: timedelta
    prune_interval: timedelta
    retention: timedelta
    failed_retention: timedelta


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs; built from the app's config plus command-line overrides."""

    concurrency: int
    lease: timedelta
    claim_batch: int
    job_timeout: timedelta
    max_sleep: timedelta
    poll_interval: timedelta
    shutdown_grace: timedelta
    maintenance: MaintenancePolicy
    queues: tuple[str, ...] | None = None
    burst: bool = False
    #: How long a handler's outcome may wait to be written with others (batched acks).
    ack_flush: timedelta = timedelta(milliseconds=5)
    #: Coroutine handlers running at once on the worker's event loop.
    async_concurrency: int = 100

    @classmethod
    def from_config(
        cls,
        config: DeferConfig,
        *,
        concurrency: int | None = None,
        queues: Collection[str] | None = None,
        burst: bool = False,
    ) -> WorkerOptions:
        """Options from the frozen config; explicit arguments win."""
        return cls(
            concurrency=concurrency if concurrency is not None else config.worker_concurrency,
            lease=config.lease,
            claim_batch=config.claim_batch,
            job_timeout=config.job_timeout,
            max_sleep=config.max_sleep,
            poll_interval=config.poll_interval,
            shutdown_grace=config.shutdown_grace,
            maintenance=config.maintenance_policy(),
            queues=tuple(queues) if queues else None,
            burst=burst,
            ack_flush=config.ack_flush,
            async_concurrency=config.async_concurrency,
        )


def _check_int(config: Mapping[str, Any], name: str, low: int, high: int | None) -> None:
    """Refuse a setting that is not an integer from *low* to *high* (None: no bound)."""
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int):
        ok = False  # True is an int to Python, never a count to a reader
    else:
        ok = low <= value and (high is None or value <= high)
    if not ok:
        bounds = f"≥ {low}" if high is None else f"from {low} to {high}"
        raise InvalidArgument(name, f"expected an integer {bounds}, got {value!r}")


def _check_bool(config: Mapping[str, Any], name: str) -> None:
    """Refuse a setting that is not exactly True or False (``"false"`` is truthy)."""
    if not isinstance(config[name], bool):
        raise InvalidArgument(name, f"expected True or False, got {config[name]!r}")


def _check_web_settings(config: Mapping[str, Any]) -> None:
    """Refuse the blueprint's settings that would build a broken URL or header."""
    prefix = config["DEFER_URL_PREFIX"]
    if not isinstance(prefix, str) or not prefix.startswith("/") or prefix.endswith("/"):
        raise InvalidArgument(
            "DEFER_URL_PREFIX", f"expected a path like '/defer' (no trailing slash), got {prefix!r}"
        )
    home = config["DEFER_DASHBOARD_HOME_URL"]
    if home is not None and (not isinstance(home, str) or not home.strip()):
        raise InvalidArgument(
            "DEFER_DASHBOARD_HOME_URL", f"expected a URL or path such as '/', or None, got {home!r}"
        )
    ancestors = config["DEFER_FRAME_ANCESTORS"]
    if ancestors is not None and (
        not isinstance(ancestors, str)
        or not ancestors.strip()
        or any(c in ancestors for c in ";,\r\n")
    ):
        # A ";" would let the setting smuggle another CSP directive into the header.
        raise InvalidArgument(
            "DEFER_FRAME_ANCESTORS",
            f"expected a frame-ancestors source list like \"'self'\" or None, got {ancestors!r}",
        )


def _database_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """``DEFER_SQLITE_SYNCHRONOUS`` (upper-cased) and ``DEFER_LISTEN_DATABASE_URI``, checked."""
    synchronous = config["DEFER_SQLITE_SYNCHRONOUS"]
    if synchronous is not None:
        if not isinstance(synchronous, str) or synchronous.upper() not in SQLITE_SYNCHRONOUS:
            raise InvalidArgument(
                "DEFER_SQLITE_SYNCHRONOUS",
                f"expected None or one of {', '.join(SQLITE_SYNCHRONOUS)}, got {synchronous!r}",
            )
        synchronous = synchronous.upper()
    listen = config["DEFER_LISTEN_DATABASE_URI"]
    if listen is not None and (not isinstance(listen, str) or not listen.strip()):
        raise InvalidArgument(
            "DEFER_LISTEN_DATABASE_URI", f"expected a database URL or None, got {listen!r}"
        )
    return {"sqlite_synchronous": synchronous, "listen_database_uri": listen}


def load_config(config: Mapping[str, Any]) -> DeferConfig:
    """Build the frozen config, with errors that name the offending key."""
    values: dict[str, Any] = {}
    for name in DEFAULTS:
        value = config[name]
        if name in _DURATIONS:
            value = as_duration(value, name)
        values[name.removeprefix("DEFER_").lower()] = value
    for name in (
        "DEFER_MAX_ATTEMPTS",
        "DEFER_CLAIM_BATCH",
        "DEFER_MAX_PAYLOAD_BYTES",
        "DEFER_RECURRING_MAX_CATCH_UP",
    ):
        # attempts are 32-bit integer columns; nothing else here needs more.
        _check_int(config, name, 1, 2**31 - 1)
    _check_bool(config, "DEFER_STRICT_LOCAL_TIMES")
    values.update(_database_settings(config))
    _check_int(config, "DEFER_TOAST_LIMIT", 1, 100)
    # -- helpers --
    values["http_allowed_hosts"] = _allowed_hosts(config["DEFER_HTTP_ALLOWED_HOSTS"])
    if values["http_timeout"] <= timedelta(0):
        raise InvalidArgument("DEFER_HTTP_TIMEOUT", "must be positive")
    values["http_allowed_networks"] = allowed_networks(config["DEFER_HTTP_ALLOWED_NETWORKS"])
    values["http_secrets"] = header_secrets(config["DEFER_HTTP_SECRETS"])
    values["webhook_secrets"] = webhook_secrets(config["DEFER_WEBHOOK_SECRETS"])
    # -- the worker --
    _check_int(config, "DEFER_WORKER_CONCURRENCY", 1, None)
    _check_int(config, "DEFER_ASYNC_CONCURRENCY", 1, None)
    for name in (
        "DEFER_LEASE",
        "DEFER_JOB_TIMEOUT",
        "DEFER_MAX_SLEEP",
        "DEFER_POLL_INTERVAL",
        "DEFER_RECLAIM_INTERVAL",
        "DEFER_PRUNE_INTERVAL",
    ):
        # Zero would make the worker spin or time every handler out at once.
        as_duration(config[name], name, allow_zero=False)
    if values["ack_flush"] >= values["lease"]:
        # A waiting outcome's lease is not renewed: it must be written well before.
        raise InvalidArgument(
            "DEFER_ACK_FLUSH", f"must be shorter than DEFER_LEASE ({values['lease']}), "
            f"got {values['ack_flush']}"
        )
    _check_bool(config, "DEFER_EMBEDDED_WORKER")
    # -- the operator dashboard and metrics --
    _check_int(config, "DEFER_DASHBOARD_PAGE_SIZE", 1, 1000)
    for name in ("DEFER_METRICS", "DEFER_METRICS_PUBLIC", "DEFER_HISTORY"):
        _check_bool(config, name)
    _check_web_settings(config)
    return DeferConfig(**values)


def _allowed_hosts(value: Any) -> frozenset[str] | None:
    """Normalise ``DEFER_HTTP_ALLOWED_HOSTS`` to lower-case host names (None: any host)."""
    if value is None:
        return None
    name = "DEFER_HTTP_ALLOWED_HOSTS"
    if isinstance(value, str):
        # A bare string would otherwise be read as a set of one-letter hosts.
        raise InvalidArgument(name, f"expected a list of host names, got the string {value!r}")
    try:
        hosts = list(value)
    except TypeError:
        raise InvalidArgument(name, f"expected a list of host names, got {value!r}") from None
    for host in hosts:
        if not isinstance(host, str) or not host.strip() or "/" in host:
            raise InvalidArgument(name, f"expected host names like 'api.example.com', got {host!r}")
    return frozenset(host.strip().lower().rstrip(".") for host in hosts)
