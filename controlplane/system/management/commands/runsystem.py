"""Run the whole system on one machine: web, Celery worker and beat, and a local fleet of simulated agents.

With no environment it runs on the embedded defaults (SQLite and the filesystem broker under ``var/``); with
``DATABASE_URL`` and ``REDIS_URL`` it uses PostgreSQL and Redis. ``--check`` starts everything, waits until
the API answers and every agent has enrolled and reported its GPUs, prints a summary and exits: the smoke
test of a checkout. A child that dies is restarted with backoff (see ``supervisor``); only a crash loop, or
Ctrl-C/SIGTERM, stops them all.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections
from django.utils import timezone

from controlplane.system.management.demo import DemoResult, operator_user, seed_demo
from controlplane.system.management.supervisor import CrashLoop, Supervisor

DEFAULT_FLEET = "sim-h100-01=8xH100-80GB,sim-h100-02=8xH100-80GB,sim-a100-01=4xA100-40GB,sim-mi300x-01=4xMI300X"
DEFAULT_BIND = "127.0.0.1:8000"
# An optional MIG layout for every GPU of the server: sim-01=2xH100-80GB:mig=3g.40gb+2g.20gb (nodeagent's spec).
_SPEC = re.compile(r"^(?P<count>[1-9]\d*)x(?P<model>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<mig>:mig=[0-9a-z.+x]*)?$")
_HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
# Join tokens minted for local agents only need to outlive the start-up.
_JOIN_TOKEN_TTL_S = 3600


@dataclass(frozen=True)
class FleetMember:
    hostname: str
    gpu_count: int
    gpu_model: str
    mig: str = ""  # ":mig=LAYOUT", or nothing

    @property
    def spec(self) -> str:
        return f"{self.gpu_count}x{self.gpu_model}{self.mig}"


def parse_fleet(raw: str) -> list[FleetMember]:
    """Parse ``host=COUNTxMODEL,...``; errors name RUNSYSTEM_FLEET and the offending entry."""
    members: list[FleetMember] = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        hostname, sep, spec = entry.partition("=")
        hostname, spec = hostname.strip(), spec.strip()
        match = _SPEC.match(spec)
        if not sep or not match:
            raise CommandError(f"RUNSYSTEM_FLEET: {entry!r} is not HOSTNAME=COUNTxMODEL (e.g. sim-01=8xH100-80GB)")
        if not _HOSTNAME.match(hostname):
            raise CommandError(f"RUNSYSTEM_FLEET: {hostname!r} is not a valid host name (lower case, digits, - and .)")
        if any(m.hostname == hostname for m in members):
            raise CommandError(f"RUNSYSTEM_FLEET: {hostname!r} appears twice")
        members.append(FleetMember(hostname, int(match["count"]), match["model"], match["mig"] or ""))
    return members


def parse_bind(raw: str, port: int | None) -> tuple[str, int]:
    host, sep, port_text = raw.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise CommandError(f"RUNSYSTEM_BIND must be HOST:PORT (e.g. {DEFAULT_BIND}), not {raw!r}")
    return host, port if port is not None else int(port_text)


def agent_state_dir(member: FleetMember) -> Path:
    return Path(settings.VAR_DIR) / "agents" / member.hostname


def container_scope(var_dir: Path | None = None) -> str:
    """A name for this system's containers on a shared Docker engine: its var directory (``var_dir``, else
    this process's), hashed."""
    return "sys-" + hashlib.sha256(str(Path(var_dir or settings.VAR_DIR).resolve()).encode()).hexdigest()[:10]


def portal_is_stale(frontend: Path) -> bool:
    """Whether any source of the portal changed since ``dist/index.html`` was built."""
    built = frontend / "dist" / "index.html"
    if not built.exists():
        return True
    built_at = built.stat().st_mtime
    for directory, subdirs, files in os.walk(frontend):
        # Pruned in place so the walk never descends into them: node_modules alone is tens of thousands of files.
        subdirs[:] = [d for d in subdirs if d not in {"node_modules", "dist"} and not d.startswith(".")]
        if any(os.stat(os.path.join(directory, name)).st_mtime > built_at for name in files):
            return True
    return False


def celery_loglevel() -> str:
    """The worker's and beat's log level. Dispatch's reconcilers run every second, so at INFO a line per task
    would drown the rest of the output; RUNSYSTEM_CELERY_LOGLEVEL=INFO shows them."""
    return (os.environ.get("RUNSYSTEM_CELERY_LOGLEVEL") or "WARNING").upper()


def verbose_from_env() -> bool:
    return (os.environ.get("RUNSYSTEM_VERBOSE") or "").strip().lower() in ("1", "true", "yes", "on")


# Celery warns when its worker runs as root. The compose image runs it as an unprivileged user; here the
# worker is this user's own process on their own machine, so unless --verbose the warning is left out.
# (A -W filter matches the message's start, taken literally.)
_ROOT_WARNING_FILTER = "ignore:You're running the worker with superuser privileges"


def docker_engine() -> tuple[bool, str]:
    """Whether a Docker engine answers here, and a word on why not.

    With an engine, the demo image (Debian's static busybox imported locally: no registry is needed) is made
    sure of, so the portal's default booking runs a real container.
    """
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        version = client.version().get("Version", "?")
    except Exception as exc:  # any failure means "no engine": the agents run without one
        return False, f"no Docker engine reachable ({exc.__class__.__name__})"
    try:
        from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

        ensure_busybox_image(client)
        image_word = f"demo image {DEFAULT_TAG} ready"
    except Exception as exc:  # a missing busybox only costs the demo image, not the engine
        image_word = f"demo image not built ({exc}); install busybox-static for it"
    finally:
        client.close()
    return True, f"Docker engine {version}; {image_word}"


class Command(BaseCommand):
    help = "Run the whole system on this machine: web, worker, beat and simulated agents."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, help="Port for the web server (overrides RUNSYSTEM_BIND's).")
        parser.add_argument(
            "--proxy-port",
            type=int,
            help="Port for the web proxy (docs/proxy.md; default: PROXY_PUBLIC_URL's, else the web port + 1, else "
            "a free one).",
        )
        parser.add_argument("--no-agents", action="store_true", help="Start no simulated agents.")
        parser.add_argument("--no-worker", action="store_true", help="Start no Celery worker or beat.")
        parser.add_argument("--no-frontend", action="store_true", help="Do not build the portal.")
        parser.add_argument("--migrate-only", action="store_true", help="Migrate and seed the demo data, then exit.")
        parser.add_argument(
            "--check",
            action="store_true",
            help="Start everything, wait until the API answers and every agent reports, print a summary, exit.",
        )
        parser.add_argument("--check-timeout", type=float, default=120.0, help="Seconds --check waits (120).")
        parser.add_argument(
            "--verbose",
            action="store_true",
            help="Show the children's start-up output in full: Celery's banners and its warning about running "
            "as root, gunicorn's INFO lines (also RUNSYSTEM_VERBOSE=1).",
        )

    verbose = False

    def handle(self, *args: Any, **options: Any) -> None:
        self.verbose = bool(options.get("verbose")) or verbose_from_env()
        fleet = [] if options["no_agents"] else parse_fleet(os.environ.get("RUNSYSTEM_FLEET") or DEFAULT_FLEET)
        host, port = parse_bind(os.environ.get("RUNSYSTEM_BIND") or DEFAULT_BIND, options["port"])
        database = settings.DATABASES["default"]
        self.note(f"database: {database['ENGINE'].rsplit('.', 1)[-1]} {database.get('NAME') or ''}".rstrip())
        self.note(f"broker:   {'redis' if settings.REDIS_URL else 'embedded (filesystem under var/broker)'}")

        # Before anything slow: a second copy of the system on the same port is the usual mistake.
        if not options["migrate_only"] and not self.port_is_free(host, port):
            raise CommandError(f"{host}:{port} is already in use: pass --port or set RUNSYSTEM_BIND")
        call_command("migrate", interactive=False, verbosity=max(0, options["verbosity"] - 1))
        self.note("database migrated")
        demo = seed_demo()
        for line in demo.notes:
            self.note(line)
        if options["migrate_only"]:
            self.print_logins(demo)
            return
        self.proxy_port = self.choose_proxy_port(host, port, options.get("proxy_port"))

        if not options["no_frontend"]:
            self.note(self.build_frontend())

        use_docker, docker_word = docker_engine() if fleet else (False, "")
        if fleet:
            self.note(f"agents:   container runtime {'docker' if use_docker else 'none'}: {docker_word}")
        self.run_children(
            fleet=fleet,
            host=host,
            port=port,
            use_docker=use_docker,
            demo=demo,
            with_worker=not options["no_worker"],
            check=options["check"],
            check_timeout=options["check_timeout"],
        )

    # --- start-up steps ---------------------------------------------------------------------------------

    proxy_port = 8001

    def choose_proxy_port(self, host: str, port: int, given: int | None) -> int:
        """The web proxy's port: as given, else PROXY_PUBLIC_URL's (an operator's choice), else the web port + 1
        when free, else any free one (two systems on one host must not fight over it)."""
        if given:
            if not self.port_is_free(host, given):
                raise CommandError(f"{host}:{given} (--proxy-port) is already in use")
            return given
        if os.environ.get("PROXY_PUBLIC_URL"):
            return urlsplit(os.environ["PROXY_PUBLIC_URL"]).port or 80
        if self.port_is_free(host, port + 1):
            return port + 1
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
            return int(probe.getsockname()[1])

    def proxy_argv(self, host: str) -> list[str]:
        bind = f"[{host}]:{self.proxy_port}" if ":" in host else f"{host}:{self.proxy_port}"
        return [sys.executable, "manage.py", "runproxy", "--bind", bind]

    _supervisor: Supervisor | None = None

    def note(self, line: str) -> None:
        # Through the supervisor once it runs, so these lines line up with the children's.
        if self._supervisor is not None:
            self._supervisor.say("runsystem", line)
        else:
            self.stdout.write(f"runsystem | {line}")

    @staticmethod
    def port_is_free(host: str, port: int) -> bool:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                return False
        return True

    def build_frontend(self) -> str:
        frontend = Path(settings.BASE_DIR) / "frontend"
        if not (frontend / "package.json").exists():
            return "portal: no frontend/ in this checkout, nothing to build"
        npm = shutil.which("npm")
        if not npm:
            return "portal: npm is not installed, so the portal is not built (the API and /admin/ still work)"
        if not portal_is_stale(frontend):
            return "portal: frontend/dist is newer than its sources, not rebuilt"
        steps: list[list[str]] = []
        if not (frontend / "node_modules").is_dir():
            steps.append([npm, "ci", "--no-audit", "--no-fund"])
        steps.append([npm, "run", "build"])
        for step in steps:
            self.note(f"portal: {' '.join(step[1:])}")
            done = subprocess.run(step, cwd=frontend, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
                for line in tail:
                    self.note(f"portal: {line}")
                return f"portal: `npm {step[1]}` failed, so the portal is not served (the API and /admin/ still work)"
        return "portal: built into frontend/dist"

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PYTHONUNBUFFERED="1",
            DJANGO_SETTINGS_MODULE=os.environ.get("DJANGO_SETTINGS_MODULE", "controlplane.settings"),
            # The children must share this process's var/ (database, broker, keys) even when it was defaulted.
            CONTROLPLANE_VAR_DIR=str(settings.VAR_DIR),
        )
        # Every child builds the same app links (web) or serves them (proxy): on this run's proxy port.
        env.setdefault("PROXY_PUBLIC_URL", f"http://localhost:{self.proxy_port}")
        env.setdefault("PROXY_APPS_URL", f"http://*.localhost:{self.proxy_port}")
        if not self.verbose:
            env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), _ROOT_WARNING_FILTER]))
        return env

    def _celery(self) -> list[str]:
        """How a Celery child starts: ``-q`` leaves out its banner unless --verbose."""
        return [sys.executable, "-m", "celery", "-A", "controlplane", *([] if self.verbose else ["-q"])]

    def web_argv(self, host: str, port: int) -> list[str]:
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if settings.DEBUG:
            return [sys.executable, "manage.py", "runserver", "--noreload", bind]
        argv = [sys.executable, "-m", "gunicorn", "controlplane.core.management.localwsgi:application",
                "--bind", bind, "--workers", "2", "--threads", "4", "--graceful-timeout", "5",
                # No request-line limit of gunicorn's (its 414 is HTML): API_MAX_URL_BYTES answers in JSON.
                "--limit-request-line", "0"]  # fmt: skip
        from gunicorn.config import KNOWN_SETTINGS

        # Newer gunicorn opens a control socket at one fixed path in $HOME, which two checkouts would share.
        if any(s.name == "control_socket_disable" for s in KNOWN_SETTINGS):
            argv.append("--no-control-socket")
        if not self.verbose:
            # Its start-up lines (version, worker pids) say nothing the "web started" line does not.
            argv += ["--log-level", "warning"]
        return argv

    def worker_argv(self) -> list[str]:
        argv = [*self._celery(), "worker", "--pool", "threads",
                "--concurrency", "4", "--loglevel", celery_loglevel(), "--hostname", "runsystem@%h"]  # fmt: skip
        if not settings.REDIS_URL:
            # Gossip and mingle poll the broker for other workers; on the filesystem broker with one worker
            # they only slow the start and fill var/broker.
            argv += ["--without-gossip", "--without-mingle"]
        return argv

    def beat_argv(self) -> list[str]:
        return [*self._celery(), "beat", "--loglevel", celery_loglevel(),
                "--schedule", str(settings.CELERY_BEAT_SCHEDULE_FILENAME)]  # fmt: skip

    @staticmethod
    def agent_argv(member: FleetMember, *, url: str, use_docker: bool) -> list[str]:
        state_dir = agent_state_dir(member)
        state_dir.mkdir(parents=True, exist_ok=True)
        # One volume root for the whole simulated fleet, as shared storage is for real servers: a volume
        # written by a job on one agent is read by the project's next job on another.
        volume_root = Path(settings.VAR_DIR) / "volumes"
        volume_root.mkdir(parents=True, exist_ok=True)
        return [
            sys.executable, "-m", "nodeagent", "run", "--server", url, "--simulate", member.spec,
            "--hostname", member.hostname, "--state-dir", str(state_dir),
            "--runtime", "docker" if use_docker else "none",
            "--volume-root", str(volume_root),
            # The simulated fleet shares one host: each agent's SSH gateway takes a free loopback port.
            *(["--ssh-listen", "127.0.0.1:0", "--ssh-address", "127.0.0.1"] if use_docker else ["--no-ssh"]),
            # Two systems on one host (two checkouts, a test beside a demo) share the engine and the demo's
            # hostnames: the scope keeps each system's agents off the other's containers.
            "--container-scope", container_scope(),
        ]  # fmt: skip

    # --- running ----------------------------------------------------------------------------------------

    def run_children(
        self,
        *,
        fleet: list[FleetMember],
        host: str,
        port: int,
        use_docker: bool,
        demo: DemoResult,
        with_worker: bool,
        check: bool,
        check_timeout: float,
    ) -> None:
        url = f"http://{'localhost' if host in {'0.0.0.0', '::'} else host}:{port}"  # noqa: S104 - a URL, not a bind
        supervisor = Supervisor(out=sys.stdout, env=self.child_env(), cwd=str(settings.BASE_DIR))
        self._supervisor = supervisor
        stop_requested: list[int] = []

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop_requested.append(signum)

        previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        deadline = time.monotonic() + check_timeout
        try:
            supervisor.start("web", self.web_argv(host, port))
            supervisor.start("proxy", self.proxy_argv(host))
            if with_worker:
                supervisor.start("worker", self.worker_argv())
                supervisor.start("beat", self.beat_argv())
            self.wait_for_web(url, supervisor, stop_requested, deadline if check else None)
            if stop_requested:
                return
            self.print_banner(url, demo)

            since = timezone.now()
            operator = operator_user()
            for member in fleet:
                supervisor.start(
                    member.hostname,
                    self.agent_argv(member, url=url, use_docker=use_docker),
                    env=self.agent_env(operator, member, restart=False),
                    restart_env=functools.partial(self.agent_env, operator, member, restart=True),
                )
            pending = {m.hostname: m for m in fleet}
            announced = False
            while not stop_requested:
                self.watch(supervisor)
                for hostname, state in self.bring_up(pending, since=since, operator=operator).items():
                    self.note(f"{hostname} enrolled and reporting; {state}")
                    del pending[hostname]
                if not pending and not announced:
                    announced = True
                    self.note(f"{len(fleet)} agents up; Ctrl-C stops everything")
                    if check:
                        self.print_summary(url, [m.hostname for m in fleet], use_docker)
                        return
                if check and time.monotonic() > deadline:
                    raise CommandError(
                        f"--check: still waiting after {check_timeout:.0f}s for {', '.join(sorted(pending))} to "
                        "enroll and report all its GPUs"
                    )
                time.sleep(0.5)
        finally:
            self.note("stopping")
            supervisor.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.note("stopped")
            self._supervisor = None

    @staticmethod
    def watch(supervisor: Supervisor) -> None:
        """Restart the children that died (the supervisor logs each); a crash loop stops everything."""
        try:
            supervisor.poll()
        except CrashLoop as exc:
            raise CommandError(f"{exc}; stopping everything") from exc

    def wait_for_web(self, url: str, supervisor: Supervisor, stop_requested: list[int], deadline: float | None) -> None:
        # The login page needs Django and the database: its 200 proves both are up.
        probe = f"{url}/admin/login/"
        started = time.monotonic()
        while not stop_requested:
            self.watch(supervisor)
            try:
                with urllib.request.urlopen(probe, timeout=2) as response:  # noqa: S310 - our own http URL
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if deadline is not None and time.monotonic() > deadline:
                raise CommandError(f"--check: the web server did not answer {probe} in time")
            if time.monotonic() - started > 60 and int(time.monotonic() - started) % 30 == 0:
                self.note(f"still waiting for {probe}")
            time.sleep(0.3)

    def agent_env(self, operator: object, member: FleetMember, *, restart: bool) -> dict[str, str]:
        """An agent's environment, made again before each of its starts.

        It holds a join token only when the agent has no credential to use: a restarted agent keeps the one
        saved in its state directory and enrolls nothing new. On a restart the saved one is trusted without
        asking the database (which may be what is down): the agent itself sets aside a credential the control
        plane refuses, and the restart after that finds none and gets a token.
        """
        env = self.child_env()
        if restart:
            close_old_connections()  # the one the main thread holds may be from before a database restart
        token = self.join_token_if_needed(operator, member, trust_stored=restart)
        if token is not None:
            # In the environment, not argv: a join token should not show in the process list.
            env["NODEAGENT_JOIN_TOKEN"] = token
        return env

    def join_token_if_needed(self, operator: object, member: FleetMember, *, trust_stored: bool) -> str | None:
        """A join token for an agent without a working credential; None when its stored one is still good
        (or, with ``trust_stored``, when it has one at all)."""
        from controlplane.core import tokens
        from controlplane.fleet.models import NodeCredential
        from nodeagent.agent import AgentState

        state = AgentState(agent_state_dir(member))
        credential = state.credential()
        if credential is None:
            return self.mint_join_token(operator, member)
        if trust_stored:
            return None
        lookup = tokens.parse(credential, tokens.NODE_CREDENTIAL)
        active = NodeCredential.objects.filter(
            lookup=lookup or "", server__hostname=member.hostname, revoked_at__isnull=True
        ).first()
        if active is not None and tokens.matches(credential, active.digest):
            return None
        # The database was reset or the credential revoked since: without this the agent would be refused
        # and stop at every start, a crash loop that takes the whole system down with it.
        state.revoke()
        self.note(f"{member.hostname}: its stored credential is unknown here; enrolling it again")
        return self.mint_join_token(operator, member)

    def mint_join_token(self, operator: object, member: FleetMember) -> str:
        try:
            from controlplane.fleet.models import NodeCredential
            from controlplane.fleet.services import credential_revoke, join_token_create
        except ImportError as exc:
            raise CommandError(f"the fleet app cannot enroll agents here ({exc}); run with --no-agents") from exc
        from controlplane.inventory.models import Server

        server = Server.objects.filter(hostname=member.hostname).first()
        if server is not None and NodeCredential.objects.filter(server=server, revoked_at__isnull=True).exists():
            # The agent's state directory was removed: the server may only enroll again once the credential
            # it no longer has is revoked, as an operator would do for a reinstalled node.
            credential_revoke(server=server, actor=operator, reason="runsystem: the local agent lost its credential")
            self.note(f"{member.hostname}: its agent lost its credential; revoked it to enroll again")
        _, plaintext = join_token_create(actor=operator, note=f"runsystem: {member.hostname}", ttl_s=_JOIN_TOKEN_TTL_S)
        return plaintext

    def bring_up(self, pending: dict[str, FleetMember], *, since: datetime, operator: object) -> dict[str, str]:
        """The pending hosts that enrolled and reported all their GPUs since ``since``, with their state.

        A new server (``commissioning``) is made ready by the operator account. One an operator put in
        maintenance or draining in an earlier run is left there: the demo never overrides a person.
        """
        if not pending:
            return {}
        from controlplane.core.errors import DomainError
        from controlplane.inventory.choices import ServerState
        from controlplane.inventory.models import Server
        from controlplane.inventory.services import server_set_state

        up = {}
        for server in Server.objects.filter(hostname__in=list(pending), last_heartbeat_at__gte=since):
            if server.gpus.filter(present=True).count() < pending[server.hostname].gpu_count:
                continue
            if server.state == ServerState.COMMISSIONING:
                try:
                    server_set_state(
                        server=server,
                        to=ServerState.READY,
                        actor=operator,
                        reason="runsystem: the local simulated server enrolled and reports its GPUs",
                    )
                except DomainError as exc:
                    self.note(f"{server.hostname}: could not make it ready: {exc.message}")
                    continue
                server.refresh_from_db(fields=["state"])
            # Offline only until this heartbeat is processed: the fleet puts it back where it was.
            if server.state not in {ServerState.COMMISSIONING, ServerState.OFFLINE}:
                up[server.hostname] = server.state
        return up

    # --- output -----------------------------------------------------------------------------------------

    def print_logins(self, demo: DemoResult) -> None:
        for login in demo.logins:
            password = login.password or "(unchanged; set DEMO_OPERATOR_PASSWORD / DEMO_TENANT_PASSWORD to reset)"
            self.note(f"login:    {login.username} / {password}  [{login.role}]")

    def print_banner(self, url: str, demo: DemoResult) -> None:
        if (Path(settings.FRONTEND_DIST) / "index.html").exists():
            self.note(f"portal:   {url}/")
        else:
            self.note("portal:   not built in this checkout; use the admin and the API")
        self.note(f"apps:     http://*.localhost:{self.proxy_port}/ (the web proxy: Open on a reservation's page)")
        self.note(f"admin:    {url}/admin/")
        self.note(f"API docs: {url}/api/v1/docs/")
        self.print_logins(demo)

    def print_summary(self, url: str, hostnames: list[str], use_docker: bool) -> None:
        from controlplane.inventory.models import Gpu, Server

        servers = list(Server.objects.filter(hostname__in=hostnames).order_by("hostname"))
        gpus = Gpu.objects.filter(server__in=servers, present=True)
        simulated = all(s.simulated for s in servers) and bool(servers)
        self.note(f"check ok: web answered at {url}/")
        proxy = url.rsplit(":", 1)[0] + f":{self.proxy_port}/_gpucp/healthz"
        try:
            with urllib.request.urlopen(proxy, timeout=5) as response:  # noqa: S310 - our own http URL
                self.note(f"check ok: the web proxy answered at {proxy} ({response.status})")
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise CommandError(f"--check: the web proxy did not answer {proxy}: {exc}") from exc
        self.note(
            f"check ok: {len(servers)} servers, {gpus.count()} GPUs, "
            f"{'simulated' if simulated else 'not all simulated'}, container runtime "
            f"{'docker' if use_docker else 'none'}"
        )
        for server in servers:
            models = sorted({g.model.name for g in gpus.filter(server=server).select_related("model")})
            self.note(
                f"  {server.hostname}: {server.state}, {gpus.filter(server=server).count()} GPUs "
                f"({', '.join(models)}){', simulated' if server.simulated else ''}"
            )
