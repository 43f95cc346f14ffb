"""Django settings.

With no environment at all the system runs on one machine: a SQLite file and an embedded (filesystem)
Celery broker under ``var/``. ``DATABASE_URL`` and ``REDIS_URL`` switch it to PostgreSQL and Redis.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from controlplane.core.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CONTROLPLANE_VAR_DIR") or BASE_DIR / "var")
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", default=False)
PRODUCTION = env_bool("CONTROLPLANE_PRODUCTION", default=False)

_secret = env_str("SECRET_KEY")
if not _secret:
    if PRODUCTION:
        raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) must be set when CONTROLPLANE_PRODUCTION is on")
    # A development key that is stable per checkout but never shipped: generated once into var/.
    _key_file = VAR_DIR / "secret_key"
    if not _key_file.exists():
        import secrets

        _key_file.write_text(secrets.token_urlsafe(50))
    _secret = _key_file.read_text().strip()
SECRET_KEY = _secret

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["*"] if not PRODUCTION else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Before staticfiles: runserver (DEBUG) leaves /static/ to WhiteNoise too, so every mode serves it alike.
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    # Swagger UI and ReDoc served from /static/, not a CDN: the API docs work without internet.
    "drf_spectacular_sidecar",
    "controlplane.core",
    "controlplane.accounts",
    "controlplane.access",
    "controlplane.inventory",
    "controlplane.fleet",
    "controlplane.ledger",
    "controlplane.reservations",
    "controlplane.dispatch",
    "controlplane.accounting",
    "controlplane.scheduling",
    # Launch templates (docs/templates.md): above reservations, whose booking it writes templates into.
    "controlplane.templates",
    # Last: whole-system tools (runsystem, the demo data) that build on every app above.
    "controlplane.system",
    # At the top of the layers: it subscribes to the others' domain events; no app imports it.
    "controlplane.notifications",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # /static/ (admin, API docs) in every mode, gunicorn included; the portal itself is core/spa.py's.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before anything reads the request: refuses an oversized body or a NUL in the path or query under /api/,
    # and answers every error page under /api/ in the API's error shape.
    "controlplane.core.api.middleware.ApiGuardMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # After authentication: the key's scope is the caller's identity.
    "controlplane.core.idempotency.IdempotencyMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_database_url = env_str("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'controlplane.sqlite3'}"
try:
    _db = dj_database_url.parse(_database_url, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0))
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is not a database URL Django understands: {exc}") from exc
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes SQLite's write lock when a transaction starts, so two booking transactions are
    # serialised instead of both reading "free" and one failing late with "database is locked".
    _db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    _db["CONN_MAX_AGE"] = 0
    # A test database in a file, not in memory: Django shares one in-memory connection between the test
    # thread and a live server's threads, which SQLite cannot use concurrently ("cannot open savepoint").
    # With a file each thread has its own connection, as in production.
    _db["TEST"] = {"NAME": str(VAR_DIR / "test-controlplane.sqlite3")}
elif _db["ENGINE"] == "django.db.backends.postgresql":
    # A persistent connection that PostgreSQL dropped while it sat idle (a restart, a failover, an idle
    # timeout) would fail the first request of every web thread that holds one: each request tests its
    # connection before use, and reconnects instead. The backend asks the socket first and the server only
    # when the socket has something to say (controlplane/core/postgresql/base.py): no round trip per request.
    _db["ENGINE"] = "controlplane.core.postgresql"
    _db["CONN_HEALTH_CHECKS"] = True
    _db.setdefault("OPTIONS", {})
    # No JIT: it pays off for long analytic queries, while the booking's reads are short but can be estimated
    # dear on a large fleet, where compiling them took 1.8 s of a 2.2 s candidate read at 10,000 servers.
    # A backend whose client died (a control-plane host lost, SIGKILL) while its query waits on a lock notices it
    # only when it next writes to the socket; meanwhile it keeps every lock its transaction took, and the other
    # hosts' bookings and heartbeats queue behind them. PostgreSQL (14+) checks the socket every 2 s while a
    # query runs and ends such a backend, releasing its locks.
    _db["OPTIONS"].setdefault("options", "-c jit=off -c client_connection_check_interval=2000")
    # Parameters bound on the server, and a statement prepared once it ran 5 times on a connection: PostgreSQL
    # then runs it from its plan instead of parsing and planning it again, a third of the database's CPU
    # for a booking. Django turns both off by default for transaction-mode connection poolers (pgbouncer
    # before 1.21); set DATABASE_PREPARED_STATEMENTS=0 behind one.
    if env_bool("DATABASE_PREPARED_STATEMENTS", default=True):
        _db["OPTIONS"].setdefault("server_side_binding", True)
        _db["OPTIONS"].setdefault("prepare_threshold", 5)
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Covering indexes (INCLUDE) are a PostgreSQL optimisation; on SQLite they are plain indexes, which is fine.
SILENCED_SYSTEM_CHECKS = ["models.W040"]

REDIS_URL = env_str("REDIS_URL")
# How long a connect to Redis, or one of its replies, may take, for the cache and the broker alike. Redis answers
# in a millisecond; past this it is down or cut off, and a request that waited longer would only hold a thread.
REDIS_TIMEOUT_S = env_float("REDIS_TIMEOUT_S", 1.0, minimum=0.05)
if REDIS_URL:
    # Fails open: a Redis outage makes every cache call a miss, never an error (controlplane/core/cache.py).
    CACHES = {
        "default": {
            "BACKEND": "controlplane.core.cache.FailOpenRedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {"socket_connect_timeout": REDIS_TIMEOUT_S, "socket_timeout": REDIS_TIMEOUT_S},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# WhiteNoise reads the files through the finders, as they are installed, so no deployment needs a
# collectstatic step; STATIC_ROOT only serves a proxy in front that wants a copy (`manage.py collectstatic`).
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # else WhiteNoise warns at every start that it is missing
FRONTEND_DIST = BASE_DIR / "frontend" / "dist"
STATICFILES_DIRS = [FRONTEND_DIST] if FRONTEND_DIST.exists() else []
MEDIA_ROOT = VAR_DIR / "media"

LOGIN_URL = "/admin/login/"

# --- REST API -------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.accounts.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.core.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    # django-filter, reading query parameters as the rest of the API does (controlplane/core/api/filter_backend.py).
    "DEFAULT_FILTER_BACKENDS": ["controlplane.core.api.filter_backend.FilterBackend"],
    # Documents every operation's error responses in the one error shape (controlplane/core/api/schema.py).
    "DEFAULT_SCHEMA_CLASS": "controlplane.core.api.schema.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.core.api.errors.exception_handler",
    # An unknown ?format= is a 400 naming it, not DRF's 404 (controlplane/core/api/negotiation.py).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "controlplane.core.api.negotiation.ContentNegotiation",
    # DRF's parsers, refusing NUL and lone surrogates in any string, JSON nested past 32 levels, and numbers
    # out of a float's range, each as a 400 naming the field (controlplane/core/api/parsers.py).
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.core.api.parsers.JSONParser",
        "controlplane.core.api.parsers.FormParser",
        "controlplane.core.api.parsers.MultiPartParser",
    ],
    "DEFAULT_THROTTLE_CLASSES": [
        "controlplane.core.api.throttling.AnonRateThrottle",
        "controlplane.core.api.throttling.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env_str("API_THROTTLE_ANON", "120/min"),
        "user": env_str("API_THROTTLE_USER", "6000/min"),
    },
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU control plane API",
    "DESCRIPTION": "Reserve exclusive bare-metal GPUs, dispatch containers to them and account for their use.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # 3.1: the agent's wire models are documented from pydantic, whose JSON Schema writes an optional value as
    # anyOf [..., {"type": "null"}], which OpenAPI 3.0 does not allow.
    "OAS_VERSION": "3.1.0",
    # Request bodies are documented as JSON, what the portal, gpucp and the agent send; forms are parsed too
    # (with the same refusals) but are not described.
    "PARSER_WHITELIST": ["controlplane.core.api.parsers.JSONParser", "rest_framework.parsers.JSONParser"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.core.api.schema.postprocess",
    ],
    # Several models have a field named "state"; each choice set gets a name of its own instead of a hash.
    "ENUM_NAME_OVERRIDES": {
        "ReservationStateEnum": "controlplane.reservations.choices.ReservationState",
        "ServerStateEnum": "controlplane.inventory.choices.ServerState",
        "NetworkModeEnum": "controlplane.reservations.choices.NetworkMode",
        "QueuedRequestStateEnum": "controlplane.scheduling.choices.RequestState",
        "MountKindEnum": [("volume", "volume"), ("dataset", "dataset")],
        "GpuVendorEnum": "controlplane.inventory.choices.Vendor",
        "MigChangeEnum": "controlplane.inventory.choices.MigChange",
        "NotificationChannelEnum": "controlplane.notifications.choices.Channel",
        "NotificationEventTypeEnum": "controlplane.notifications.choices.EventType",
    },
}

# Read here: the beat schedule below looks for lost servers once per heartbeat interval.
FLEET_HEARTBEAT_INTERVAL_S = env_float("FLEET_HEARTBEAT_INTERVAL_S", 5.0, minimum=0.1)

# --- Celery ---------------------------------------------------------------------------------------------
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "visibility_timeout": 3600,
        # Without a socket timeout, a publish to a Redis that accepted the connection and then stopped answering
        # waits forever, inside the booking request or the heartbeat that enqueues it. The worker's BRPOP is
        # not bound by it (kombu's event loop checks that connection itself).
        "socket_timeout": REDIS_TIMEOUT_S,
        "socket_connect_timeout": REDIS_TIMEOUT_S,
    }
else:
    # The embedded broker: kombu's filesystem transport, good for one machine and no extra service.
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("out", "processed"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    # The host is not used, but without one kombu warns "No hostname was supplied" on every connection.
    CELERY_BROKER_URL = "filesystem://localhost//"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        # Else kombu keeps its exchange table in ./control, wherever the worker was started.
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", default=False)
# A worker (or beat) outlives any broker outage: it retries the connection forever, also when the broker is down
# as it starts (Celery's default gives up after 100 attempts, and warns that the start-up default will change).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
# A local shelve of when each entry last ran: one per beat, never on storage shared by two beats (each control-plane
# host runs its own beat, and compose.yaml's beats keep it in their own containers).
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Periodic reconcilers. Each handles one item at a time and returns whether it found work. Every host runs a beat,
# so each entry is sent once per beat: each task is idempotent or takes its leader lease (controlplane/core/
# leader.py); docs/operations.md, "Periodic work with two beats", says which and why, entry by entry (its test,
# tests/core/test_leader_schedule.py, fails on an entry added here and not there).
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "fleet-detect-lost-servers": {
        "task": "controlplane.fleet.tasks.detect_lost_servers",
        "schedule": FLEET_HEARTBEAT_INTERVAL_S,
    },
    "fleet-prune-telemetry": {"task": "controlplane.fleet.tasks.prune_telemetry", "schedule": 3600.0},
    "core-prune-idempotency-records": {"task": "controlplane.core.tasks.prune_idempotency_records", "schedule": 3600.0},
    # Ledger: each project's credits for the month, once per project and period.
    "ledger-grant-period-credits": {"task": "controlplane.ledger.tasks.grant_period_credits", "schedule": 10.0},
    # Dispatch: one indexed query each when there is nothing to do; the heartbeat opens windows too.
    "dispatch-open-due": {"task": "controlplane.dispatch.tasks.open_due", "schedule": 1.0},
    "dispatch-close-due": {"task": "controlplane.dispatch.tasks.close_due", "schedule": 1.0},
    # Accounting: hourly rollups of the minute telemetry, usage records of final reservations, statements.
    "accounting-rollup-usage-hours": {"task": "controlplane.accounting.tasks.rollup_usage_hours", "schedule": 120.0},
    "accounting-reclaim-idle": {"task": "controlplane.accounting.tasks.reclaim_idle", "schedule": 60.0},
    "accounting-record-pending-usage": {"task": "controlplane.accounting.tasks.record_pending_usage", "schedule": 60.0},
    "accounting-monthly-statements": {
        "task": "controlplane.accounting.tasks.generate_monthly_statements",
        "schedule": 3600.0,
    },
    # Access: each volume's storage hours as they end, once per volume and hour.
    "access-charge-volume-storage": {"task": "controlplane.access.tasks.charge_volume_storage", "schedule": 60.0},
    # Scheduling: start what fits of the queue (also run whenever a reservation frees its GPUs, and on submit).
    "scheduling-schedule-pass": {"task": "controlplane.scheduling.tasks.schedule_pass", "schedule": 5.0},
    # Notifications: fan out and send what a lost task left (first attempts and retries); "ends in N".
    "notifications-reconcile": {"task": "controlplane.notifications.tasks.reconcile", "schedule": 5.0},
    "notifications-ends-soon": {"task": "controlplane.notifications.tasks.ends_soon", "schedule": 30.0},
}

# --- Access ---------------------------------------------------------------------------------------------
# The web proxy (docs/proxy.md): where browsers reach it (the web terminal's WebSocket), and the URL of each
# app, "*" standing for the label "<reservation id>-<port name>". Any "*.localhost" name reaches loopback in a
# browser, so the defaults work on one machine; in production give the proxy a wildcard DNS name and
# certificate of its own domain (an app's pages then share no origin with the portal).
PROXY_PUBLIC_URL = (env_str("PROXY_PUBLIC_URL") or "http://localhost:8001").rstrip("/")
PROXY_APPS_URL = (env_str("PROXY_APPS_URL") or "http://*.localhost:8001").rstrip("/")
if PROXY_APPS_URL.count("*") != 1 or not PROXY_APPS_URL.split("://", 1)[-1].startswith("*."):
    raise ImproperlyConfigured(
        f'PROXY_APPS_URL must be a URL whose host starts with "*." (e.g. https://*.apps.example.org), '
        f"not {PROXY_APPS_URL!r}"
    )
# How long a link from "Open" (or a terminal's) may wait to be used, at most: it is good once, never past the
# reservation's window.
PROXY_LINK_TTL_S = env_int("PROXY_LINK_TTL_S", 60, minimum=5)
# How long the proxy trusts what it read of a reservation (its window, its members) before reading it again.
PROXY_GRANT_CACHE_S = env_float("PROXY_GRANT_CACHE_S", 2.0, minimum=0.0)
# How many proxies (load balancers) in front of the web proxy append to X-Forwarded-For: the browser's address
# recorded in the events is the one that many entries from the right. 0: the connection's own peer.
PROXY_FORWARDED_HOPS = env_int("PROXY_FORWARDED_HOPS", 0, minimum=0)
# An SSH connection to a node's gateway with nothing open on it is closed after this long.
PROXY_TUNNEL_IDLE_S = env_float("PROXY_TUNNEL_IDLE_S", 120.0, minimum=1.0)
# Credits per GiB-hour of a volume's size limit (docs/volumes.md, "Charges").
ACCESS_VOLUME_CREDITS_PER_GIB_HOUR = env_str("ACCESS_VOLUME_CREDITS_PER_GIB_HOUR") or "0.001"
try:
    _rate: Decimal | None = Decimal(ACCESS_VOLUME_CREDITS_PER_GIB_HOUR)
except ArithmeticError:
    _rate = None
if _rate is None or not _rate.is_finite() or _rate < 0:
    raise ImproperlyConfigured(
        f"ACCESS_VOLUME_CREDITS_PER_GIB_HOUR must be a decimal number of credits >= 0, "
        f"not {ACCESS_VOLUME_CREDITS_PER_GIB_HOUR!r}"
    )

# --- Accounting -----------------------------------------------------------------------------------------
# Minutes newer than this are not rolled up yet: their heartbeats may still be arriving.
ACCOUNTING_ROLLUP_LAG_S = env_int("ACCOUNTING_ROLLUP_LAG_S", 120, minimum=0)
# A held GPU-minute under this mean utilization (percent) is idle.
ACCOUNTING_IDLE_UTIL_PERCENT = env_float("ACCOUNTING_IDLE_UTIL_PERCENT", 5.0, minimum=0.0)
# A report flags a mean utilization under this (percent).
ACCOUNTING_LOW_UTIL_PERCENT = env_float("ACCOUNTING_LOW_UTIL_PERCENT", 70.0, minimum=0.0)
# The currency of the sites' electricity prices (Site.electricity_price_per_kwh), for energy cost.
ENERGY_CURRENCY = env_str("ENERGY_CURRENCY", "USD") or "USD"

# --- Scheduling (docs/scheduling.md) -------------------------------------------------------------------
# Fair share: the half-life, in days, of the usage that orders projects within a class.
SCHEDULING_FAIRSHARE_HALF_LIFE = env_float("SCHEDULING_FAIRSHARE_HALF_LIFE", 7.0, minimum=0.01)
# The most requests one pass tries to book (each try is a booking attempt, and a shadow-time search when the
# GPUs are busy): a pass stays bounded however long the queue is; the rest wait for the next pass.
SCHEDULING_PASS_MAX_TRIES = env_int("SCHEDULING_PASS_MAX_TRIES", 50, minimum=1)


# --- Notifications (docs/notifications.md) -------------------------------------------------------------
def _seconds_list(name: str, default: list[int]) -> list[int]:
    raw = env_list(name, [str(v) for v in default])
    try:
        values = [int(v) for v in raw]
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a comma-separated list of whole seconds, not {raw!r}") from exc
    if any(v < 0 for v in values):
        raise ImproperlyConfigured(f"{name} must hold seconds >= 0, not {values}")
    return values


# Where links in emails and webhook payloads point: the portal's address as its users reach it.
NOTIFICATIONS_PORTAL_URL = env_str("NOTIFICATIONS_PORTAL_URL") or "http://127.0.0.1:8000"
# "Ends in N" warnings, in seconds before the end (default 1 h and 10 min).
NOTIFICATIONS_ENDS_IN_S = _seconds_list("NOTIFICATIONS_ENDS_IN_S", [3600, 600])
# The wait after each failed webhook attempt: exponential, 23.7 h in all; after the last, the endpoint is disabled.
NOTIFICATIONS_WEBHOOK_RETRY_S = _seconds_list(
    "NOTIFICATIONS_WEBHOOK_RETRY_S", [5, 30, 120, 600, 1800, 3600, 7200, 14400, 28800, 28800]
)
NOTIFICATIONS_WEBHOOK_TIMEOUT_S = env_float("NOTIFICATIONS_WEBHOOK_TIMEOUT_S", 5.0, minimum=0.1)
# Server-side request forgery: webhook URLs that resolve to loopback, link-local, private or reserved addresses
# are refused unless the operator allows them (a receiver on the operator's own network).
NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = env_bool("NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE", default=False)
# After a secret rotation the old secret keeps signing (a second signature) this long.
NOTIFICATIONS_SECRET_OVERLAP_S = env_int("NOTIFICATIONS_SECRET_OVERLAP_S", 24 * 3600, minimum=0)
NOTIFICATIONS_EMAIL_RETRY_S = _seconds_list("NOTIFICATIONS_EMAIL_RETRY_S", [30, 120, 600, 1800, 3600])

# Email: SMTP when EMAIL_HOST is set; otherwise each message is written under var/outbox/ (the demo, offline),
# and the portal lists them (GET /api/v1/notifications/outbox/).
EMAIL_HOST = env_str("EMAIL_HOST") or ""
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER") or ""
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD") or ""
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL") or "gpucp@localhost"
EMAIL_BACKEND = env_str("EMAIL_BACKEND") or (
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.filebased.EmailBackend"
)
EMAIL_FILE_PATH = str(VAR_DIR / "outbox")
NOTIFICATIONS_OUTBOX_VISIBLE = EMAIL_BACKEND == "django.core.mail.backends.filebased.EmailBackend"

# --- Dispatch -------------------------------------------------------------------------------------------
# A launch is sent this long before its window so the agent starts it on its own clock at the start.
DISPATCH_LEAD_S = env_float("DISPATCH_LEAD_S", 2.0, minimum=0.0)
# The container is told (warning file + SIGUSR1) this long before its window closes.
DISPATCH_WARN_BEFORE_S = env_int("DISPATCH_WARN_BEFORE_S", 300, minimum=0)
# SIGTERM at the end, SIGKILL this long after.
DISPATCH_STOP_GRACE_S = env_int("DISPATCH_STOP_GRACE_S", 30, minimum=0)
# A launch not running this long after its window opened is failed (image pulls may be slow).
DISPATCH_START_TIMEOUT_S = env_int("DISPATCH_START_TIMEOUT_S", 600, minimum=1)
# After the end plus the grace, how long to wait for the agent to confirm the stop before closing anyway.
DISPATCH_STOP_TIMEOUT_S = env_int("DISPATCH_STOP_TIMEOUT_S", 60, minimum=1)
# Windows opening within this are scheduled with an ETA at booking; below the broker's visibility timeout,
# so an unacknowledged ETA task is never redelivered while it waits.
DISPATCH_ETA_HORIZON_S = env_int("DISPATCH_ETA_HORIZON_S", 3000, minimum=0)
DISPATCH_PUSH_TIMEOUT_S = env_float("DISPATCH_PUSH_TIMEOUT_S", 3.0, minimum=0.1)
# An interrupted reservation with less than this left is not requeued.
DISPATCH_REQUEUE_MIN_S = env_int("DISPATCH_REQUEUE_MIN_S", 5, minimum=0)
# Live logs (docs/dispatch.md): the newest bytes kept per launch; older output is dropped, and the API says so.
DISPATCH_LOG_KEEP_BYTES = env_int("DISPATCH_LOG_KEEP_BYTES", 1_048_576, minimum=1024)
# A follow stream (Server-Sent Events) ends after this long and the client reconnects with its cursor: each
# open stream holds one of the web server's threads.
DISPATCH_LOG_FOLLOW_MAX_S = env_float("DISPATCH_LOG_FOLLOW_MAX_S", 300.0, minimum=1.0)
# Pre-pull (docs/images.md): how long before its window an advance reservation's image is pulled on its servers;
# a window nearer than this at booking is pulled from the next heartbeat on.
IMAGES_PREPULL_LEAD_S = env_int("IMAGES_PREPULL_LEAD_S", 1800, minimum=0)

# --- Fleet ----------------------------------------------------------------------------------------------
# A server is offline once this many heartbeat intervals pass without one.
FLEET_OFFLINE_AFTER_INTERVALS = env_int("FLEET_OFFLINE_AFTER_INTERVALS", 3, minimum=1)
# Fencing (docs/fleet.md): an agent stops its containers after this many intervals without an answered heartbeat
# (its lease); fewer than the offline threshold, so it has stopped them before the control plane even calls it
# offline. Its launches are requeued only after the lease, DISPATCH_STOP_GRACE_S and this margin.
FLEET_FENCE_AFTER_INTERVALS = env_int("FLEET_FENCE_AFTER_INTERVALS", 2, minimum=1)
if FLEET_FENCE_AFTER_INTERVALS >= FLEET_OFFLINE_AFTER_INTERVALS:
    raise ImproperlyConfigured(
        f"FLEET_FENCE_AFTER_INTERVALS ({FLEET_FENCE_AFTER_INTERVALS}) must be less than "
        f"FLEET_OFFLINE_AFTER_INTERVALS ({FLEET_OFFLINE_AFTER_INTERVALS}): an agent must stop its containers "
        "before the control plane calls its server offline"
    )
FLEET_REQUEUE_MARGIN_S = env_float("FLEET_REQUEUE_MARGIN_S", 10.0, minimum=1.0)
# Outage tolerance (docs/fleet.md, "Outages and node loss"): work that nothing would replace (the project did not
# opt in to requeue) keeps running through this much silence between an agent and the control plane; its agent
# ends it at its window's end from the desired state it holds, or stops it once the silence passes this.
FLEET_OUTAGE_TOLERANCE_S = env_float("FLEET_OUTAGE_TOLERANCE_S", 1800.0, minimum=60.0)
# No server is declared lost during this grace after the control plane (its node-loss detector) starts again or
# its database returns: the silence was ours.
FLEET_STARTUP_GRACE_S = env_float("FLEET_STARTUP_GRACE_S", 60.0, minimum=0.0)
# Disruption: when more than this share of the live servers (and at least FLEET_DISRUPTION_MIN_SERVERS of them)
# are silent together, node-loss handling is held: the fault is more likely ours than theirs.
FLEET_DISRUPTION_SHARE = env_float("FLEET_DISRUPTION_SHARE", 0.55, minimum=0.0)
FLEET_DISRUPTION_MIN_SERVERS = env_int("FLEET_DISRUPTION_MIN_SERVERS", 2, minimum=1)
FLEET_GPU_TEMP_LIMIT_C = env_float("FLEET_GPU_TEMP_LIMIT_C", 90.0)
FLEET_HEARTBEAT_MAX_BYTES = env_int("FLEET_HEARTBEAT_MAX_BYTES", 2_000_000, minimum=1024)
FLEET_JOIN_TOKEN_TTL_S = env_int("FLEET_JOIN_TOKEN_TTL_S", 24 * 3600, minimum=60)
TELEMETRY_MINUTE_RETENTION_DAYS = env_int("TELEMETRY_MINUTE_RETENTION_DAYS", 14, minimum=1)
# /metrics without credentials, for a Prometheus on a trusted network; off: an operator's bearer token.
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", default=True)
# The deadline of a readiness probe's dependency checks (controlplane/core/health.py); keep the probe's own
# timeout above it.
HEALTH_CHECK_TIMEOUT_S = env_float("HEALTH_CHECK_TIMEOUT_S", 2.0, minimum=0.1)

# --- Request limits -------------------------------------------------------------------------------------
# The largest request body the API reads (a 413 request_too_large above it); the agent's endpoints keep their
# own limits (FLEET_HEARTBEAT_MAX_BYTES for the heartbeat).
API_MAX_REQUEST_BYTES = env_int("API_MAX_REQUEST_BYTES", 1_048_576, minimum=1024)
# The longest path and query string under /api/ (bytes, as sent): a longer one is a 414 in the API's error shape
# (controlplane/core/api/middleware.py). The web server is started with no request-line limit of its own
# (gunicorn --limit-request-line 0) so that this one, and its JSON answer, is the limit.
API_MAX_URL_BYTES = env_int("API_MAX_URL_BYTES", 8192, minimum=1024)
# Django's own ceiling on a body read into memory: never below a limit above, or Django would refuse first.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(API_MAX_REQUEST_BYTES, FLEET_HEARTBEAT_MAX_BYTES)
CSRF_FAILURE_VIEW = "controlplane.core.api.errors.csrf_failure"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

if PRODUCTION:
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)

# --- Vault and images: project secrets, registry credentials, the image check at booking (docs/images.md) ---
# Fernet keys (comma-separated) that encrypt project secrets and registry passwords at rest: the first encrypts,
# every one decrypts, so a key is rotated by putting a new one first (then `manage.py vault_rotate`). Without
# it, a key is generated once into the var directory (mode 0600); a production deployment must give it.
_vault_keys = env_str("CONTROLPLANE_ENCRYPTION_KEYS")
if not _vault_keys:
    if PRODUCTION:
        raise ImproperlyConfigured(
            "CONTROLPLANE_ENCRYPTION_KEYS (or CONTROLPLANE_ENCRYPTION_KEYS_FILE) must be set when "
            "CONTROLPLANE_PRODUCTION is on: it encrypts project secrets and registry passwords"
        )
    from controlplane.core.env import generated_key_file

    _vault_keys = generated_key_file(VAR_DIR / "encryption_key")
CONTROLPLANE_ENCRYPTION_KEYS = [key.strip() for key in _vault_keys.split(",") if key.strip()]
# How a booking's container.image is checked: "verify" (syntax, then a manifest request to the registry with the
# project's credentials) or "syntax" (no network). Production verifies by default; a development or test
# installation checks the syntax only, so that nothing reaches out unless asked to.
IMAGES_CHECK_AT_BOOKING = env_str("IMAGES_CHECK_AT_BOOKING") or ("verify" if PRODUCTION else "syntax")
if IMAGES_CHECK_AT_BOOKING not in ("verify", "syntax"):
    raise ImproperlyConfigured(f'IMAGES_CHECK_AT_BOOKING must be "verify" or "syntax", not {IMAGES_CHECK_AT_BOOKING!r}')
# The registries bookings may name (host[:port] as an image reference gives it: docker.io, nvcr.io,
# 127.0.0.1:5000); empty: all.
IMAGES_ALLOWED_REGISTRIES = env_list("IMAGES_ALLOWED_REGISTRIES", [])
# The most a booking waits on a registry, all requests together; an unreachable registry is remembered this long
# (bookings then skip the check and say so), a found image this long.
IMAGES_CHECK_TIMEOUT_S = env_float("IMAGES_CHECK_TIMEOUT_S", 4.0, minimum=0.1)
IMAGES_CHECK_UNREACHABLE_TTL_S = env_float("IMAGES_CHECK_UNREACHABLE_TTL_S", 60.0, minimum=0.0)
IMAGES_CHECK_FOUND_TTL_S = env_float("IMAGES_CHECK_FOUND_TTL_S", 300.0, minimum=0.0)
# The vault app (controlplane/vault): below reservations, which name its secrets at booking.
INSTALLED_APPS.insert(INSTALLED_APPS.index("controlplane.reservations"), "controlplane.vault")

# --- Container resources (docs/reservations.md, "Resources") --------------------------------------------
# What a container gets of its server besides its GPUs, in proportion to the GPUs (MIG memory slices) it holds
# there: "proportional" CPU cores and host memory (after what is kept for the system), or "none" (no limit).
CONTAINER_CPU_POLICY = env_str("CONTAINER_CPU_POLICY", "proportional")
CONTAINER_MEMORY_POLICY = env_str("CONTAINER_MEMORY_POLICY", "proportional")
# Cores and the share of host memory kept for the system (agent, engine, page cache) before the split.
CONTAINER_SYSTEM_CPUS = env_int("CONTAINER_SYSTEM_CPUS", 0, minimum=0)
CONTAINER_SYSTEM_MEMORY_FRACTION = env_float("CONTAINER_SYSTEM_MEMORY_FRACTION", 0.1, minimum=0.0)
# /dev/shm for PyTorch's DataLoader workers: this share of the container's memory, within the bounds; when the
# server's memory is unknown, the fixed size.
CONTAINER_SHM_FRACTION = env_float("CONTAINER_SHM_FRACTION", 0.5, minimum=0.0)
CONTAINER_SHM_MIN_MIB = env_int("CONTAINER_SHM_MIN_MIB", 1024, minimum=1)
CONTAINER_SHM_MAX_MIB = env_int("CONTAINER_SHM_MAX_MIB", 65536, minimum=1)
CONTAINER_SHM_UNKNOWN_MIB = env_int("CONTAINER_SHM_UNKNOWN_MIB", 8192, minimum=1)
# name=soft[:hard], as docker run --ulimit; -1 is unlimited. NVIDIA's recommendation for its framework
# containers: memlock unlimited, a 64 MB stack.
CONTAINER_ULIMITS = env_str("CONTAINER_ULIMITS", "memlock=-1,stack=67108864")
