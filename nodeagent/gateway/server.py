"""The node agent's SSH gateway: ``ssh -p 2222 <reservation>@<node>`` lands in that reservation's container.

asyncssh runs in a thread of its own with its own event loop; the agent's loop only calls ``update`` (the
desired state it just converged to), ``facts`` and ``close``. Blocking Docker calls run in a small thread
pool, never on the event loop. DESIGN invariant 11: a login reaches only the running container of a
reservation whose window is open, with a key its project's owners and members hold; every session runs
inside that container (Docker exec, the container's file system, its network namespace), never on the host.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncssh
import docker

from nodeagent import schema
from nodeagent.gateway import hostkey
from nodeagent.gateway.container import ENGINE_ERRORS, Target, find_running
from nodeagent.gateway.execbridge import command_argv, run_exec
from nodeagent.gateway.netns import bridge, connect_in_netns, loopback
from nodeagent.gateway.sessions import (
    GATEWAY_STOPPED_LINE,
    STOPPED_LINE,
    Session,
    ended_line,
    new_session_id,
    peer,
    warning_line,
)
from nodeagent.gateway.sftp import ContainerSFTPServer
from nodeagent.gateway.table import AccessTable, Decision, not_running, when

log = logging.getLogger(__name__)

TICK_S = 1.0
START_TIMEOUT_S = 30.0
# Long enough for the last line on a terminal to leave before the connection is cut.
CLOSE_DELAY_S = 0.2


def _utcnow() -> datetime:
    return datetime.now(UTC)


class _Connection(asyncssh.SSHServer):
    """One client connection: its authentication, then its session and port forwards."""

    def __init__(self, gateway: SshGateway) -> None:
        self.gateway = gateway
        self.conn: asyncssh.SSHServerConnection | None = None
        self.decision: Decision | None = None
        self.target: Target | None = None
        self.session: Session | None = None
        self._banners: set[str] = set()

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is not None:
            if exc is None:
                reason = "client disconnected"
            elif isinstance(exc, asyncssh.ConnectionLost):
                reason = "connection lost"  # no disconnect message: a network failure or a killed client
            else:
                reason = f"connection closed: {exc}"
            self.gateway._closed(self.session, reason)

    def _banner(self, text: str) -> None:
        if text not in self._banners and self.conn is not None:
            self._banners.add(text)
            with contextlib.suppress(OSError):
                self.conn.send_auth_banner(text + "\r\n")

    # -- authentication: public keys only --------------------------------------------------------------------

    def begin_auth(self, username: str) -> bool:
        refusal = self.gateway.table.admit(username, self.gateway.clock()).refusal
        if refusal is not None:
            self._banner(refusal)  # no key can help: said before the client tries any
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        decision = self.gateway.table.authorize(username, key.public_data, self.gateway.clock())
        if decision.grant is None:
            self._banner(decision.refusal or "")
            return False
        try:
            target = await self.gateway.blocking(
                find_running, self.gateway.api, node=self.gateway.node, launch_id=decision.grant.launch_id
            )
        except ENGINE_ERRORS as exc:
            log.warning("ssh login to %s: cannot ask the Docker engine: %s", username, exc)
            target = None
        if target is None:
            self._banner(not_running(username))
            return False
        self.decision, self.target = decision, target
        return True

    def auth_completed(self) -> None:
        assert self.conn is not None and self.decision is not None and self.target is not None
        grant, key = self.decision.grant, self.decision.key
        assert grant is not None and key is not None
        self.session = Session(
            session_id=new_session_id(),
            reservation=grant.reservation,
            launch_id=grant.launch_id,
            user=key.user,
            fingerprint=key.fingerprint,
            source=peer(self.conn),
            started_at=self.gateway.clock(),
            target=self.target,
            conn=self.conn,
        )
        self.gateway._opened(self.session)

    # -- forwarding: local forwards to the container's loopback only ----------------------------------------

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> Any:
        session = self.session
        resolved = loopback(dest_host)
        if session is None or not self.gateway._allowed(session):
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "gpucp: session closed")
        if resolved is None or not 0 < dest_port < 65536:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                f"gpucp: only ports on the container's own localhost can be forwarded, not {dest_host}:{dest_port}",
            )
        return self._forward(session, *resolved, dest_port)

    async def _forward(self, session: Session, family: Any, address: str, port: int) -> asyncssh.SSHTCPSession[bytes]:
        try:
            sock = await self.gateway.blocking(connect_in_netns, session.target.pid, family, address, port)
        except OSError as exc:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_CONNECT_FAILED,
                f"gpucp: nothing accepts connections on {address}:{port} in the container ({exc.strerror or exc})",
            ) from None
        session.used("forward")
        return await bridge(sock)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # -R would open a listener on the host

    def unix_connection_requested(self, dest_path: str) -> bool:
        return False

    def unix_server_requested(self, listen_path: str) -> bool:
        return False


class SshGateway:
    """The gateway. ``start()`` listens; ``update()`` after every converge; ``close()`` ends every session.

    ``on_session`` receives a ``schema.AgentEvent`` of kind "session" at each session's open and close; it is
    called from the gateway's thread and must only queue the event.
    """

    def __init__(
        self,
        *,
        state_dir: str | Path,
        node: str,
        docker_client: Any = None,
        bind: tuple[str, int] = ("0.0.0.0", 2222),  # noqa: S104
        address: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
        on_session: Callable[[schema.AgentEvent], None] | None = None,
        tick_s: float = TICK_S,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.node = node
        client = docker_client if docker_client is not None else docker.from_env(timeout=30)
        self.api = getattr(client, "api", client)
        self.bind = bind
        self.address = address
        self.clock = clock
        self.on_session = on_session
        self.tick_s = tick_s
        self.table = AccessTable()
        self._host_key: asyncssh.SSHKey | None = None
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="gpucp-ssh-io")
        self._sessions: dict[str, Session] = {}
        self._ticker: asyncio.Task[None] | None = None

    # -- the agent's side -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Listen; returns once the port is bound. Raises ``OSError`` (bind) or ``hostkey.HostKeyError``."""
        self._host_key = hostkey.load_or_create(self.state_dir)
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="gpucp-ssh-gateway", daemon=True)
        self._thread.start()
        self._port = ready.result(timeout=START_TIMEOUT_S)
        log.info("SSH gateway listening on %s:%d", self.bind[0], self._port)

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the SSH gateway is not started")
        return self._port

    @property
    def host_key_line(self) -> str:
        if self._host_key is None:
            raise RuntimeError("the SSH gateway is not started")
        return hostkey.public_line(self._host_key)

    def facts(self) -> schema.SshGatewayFacts:
        return schema.SshGatewayFacts(port=self.port, host_key=self.host_key_line, address=self.address)

    def update(self, desired: list[schema.DesiredContainer], stop: list[str], now: datetime) -> None:
        """The desired state the agent converged to: who may log in from now on. Thread-safe."""
        self.table.update(desired, stop)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closing
                loop.call_soon_threadsafe(self._watch, now)

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError, concurrent.futures.TimeoutError):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the gateway's thread -------------------------------------------------------------------------------

    def _run(self, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            self._acceptor = loop.run_until_complete(self._listen())
        except BaseException as exc:
            ready.set_exception(exc)
            loop.close()
            return
        self._loop = loop
        self._ticker = loop.create_task(self._tick())
        ready.set_result(self._acceptor.get_port())
        try:
            loop.run_forever()
        finally:
            # Every task ends here, on this loop: one left for the garbage collector would run its cleanup on
            # a closed loop, in whatever thread collects it.
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            with contextlib.suppress(BaseException):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _listen(self) -> asyncssh.SSHAcceptor:
        if logging.getLogger("asyncssh").level == logging.NOTSET:
            logging.getLogger("asyncssh").setLevel(logging.WARNING)  # one INFO line per packet type otherwise
        assert self._host_key is not None
        return await asyncssh.listen(
            self.bind[0],
            self.bind[1],
            reuse_address=True,
            server_factory=functools.partial(_Connection, self),
            server_host_keys=[self._host_key],
            process_factory=self._process,
            sftp_factory=self._sftp,
            allow_scp=True,
            line_editor=False,  # keystrokes go to the container's own terminal
            encoding=None,
            agent_forwarding=False,
            x11_forwarding=False,
            password_auth=False,
            kbdint_auth=False,
            gss_host=None,
            login_timeout=60,
            keepalive_interval=30,
            keepalive_count_max=4,
        )

    async def blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                self._watch(self.clock())
            except Exception:
                log.exception("checking the SSH sessions' windows failed")

    def _watch(self, now: datetime) -> None:
        """Warn the sessions of a window about to end; close those whose window ended or that were stopped."""
        for session in list(self._sessions.values()):
            grant = self.table.current(session.reservation, session.launch_id)
            if grant is None:
                self._end(session, "the reservation was stopped", STOPPED_LINE)
            elif now >= grant.window_end:
                self._end(session, f"the window ended at {when(grant.window_end)}", ended_line(grant.window_end))
            elif (
                now >= grant.window_end - timedelta(seconds=grant.warn_before_s)
                and session.warned_for != grant.window_end
            ):
                session.warned_for = grant.window_end  # an extended window earns a new warning
                session.tell(warning_line(grant.window_end, now))

    def _allowed(self, session: Session) -> bool:
        grant = self.table.current(session.reservation, session.launch_id)
        return not session.closed and grant is not None and grant.is_open(self.clock())

    def _end(self, session: Session, reason: str, line: str) -> None:
        if session.close_reason is not None:
            return
        session.close_reason = reason
        session.tell(line)

        def cut() -> None:
            session.conn.disconnect(asyncssh.DISC_BY_APPLICATION, line.strip("* "))

        asyncio.get_running_loop().call_later(CLOSE_DELAY_S, cut)

    def _opened(self, session: Session) -> None:
        self._sessions[session.session_id] = session
        log.info("ssh session %s opened: %s as %s from %s", session.session_id, session.user, session.reservation,
                 session.source)  # fmt: skip
        self._emit(session.event("open", self.clock()))

    def _closed(self, session: Session, reason: str) -> None:
        if session.closed:
            return
        session.closed = True
        session.close_reason = session.close_reason or reason
        self._sessions.pop(session.session_id, None)
        log.info("ssh session %s closed: %s", session.session_id, session.close_reason)
        self._emit(session.event("close", self.clock()))

    def _emit(self, event: schema.AgentEvent) -> None:
        if self.on_session is not None:
            try:
                self.on_session(event)
            except Exception:
                log.exception("recording an SSH session event failed")

    async def _shutdown(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()  # no new connections, then the open ones end
        sessions = list(self._sessions.values())
        for session in sessions:
            session.close_reason = session.close_reason or "the node agent stopped"
            session.tell(GATEWAY_STOPPED_LINE)
        await asyncio.sleep(CLOSE_DELAY_S if sessions else 0)
        for session in sessions:
            session.conn.disconnect(asyncssh.DISC_BY_APPLICATION, "the node agent is stopping")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(s.conn.wait_closed() for s in sessions)), timeout=5)
        if self._acceptor is not None:
            await self._acceptor.wait_closed()

    # -- sessions -------------------------------------------------------------------------------------------

    @staticmethod
    def _session_of(chan: Any) -> Session | None:
        owner = chan.get_connection().get_owner()
        return owner.session if isinstance(owner, _Connection) else None

    async def _process(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        session = self._session_of(process.channel)
        code = 255
        try:
            if session is None or not self._allowed(session):
                process.stderr.write(b"gpucp: this session is closed\n")
            elif process.subsystem is not None:
                process.stderr.write(f"gpucp: no subsystem {process.subsystem} here (sftp is)\n".encode())
                code = 1
            else:
                session.used("shell" if process.command is None else "exec")
                session.processes.add(process)
                try:
                    code = await run_exec(
                        self.api,
                        session.target.container_id,
                        process,
                        argv=command_argv(process.command),
                        blocking=self.blocking,
                    )
                except ENGINE_ERRORS as exc:
                    process.stderr.write(f"gpucp: the container cannot run this session: {exc}\n".encode())
                finally:
                    session.processes.discard(process)
        except (ConnectionError, asyncssh.Error):
            pass
        finally:
            with contextlib.suppress(Exception):
                process.exit(code)

    def _sftp(self, chan: asyncssh.SSHServerChannel[bytes]) -> asyncssh.SFTPServer:
        session = self._session_of(chan)
        if session is None:  # asyncssh opens no channel before authentication
            raise RuntimeError("an SFTP channel without an authenticated session")
        session.used("sftp")
        return ContainerSFTPServer(
            chan,
            api=self.api,
            target=session.target,
            blocking=self.blocking,
            allowed=functools.partial(self._allowed, session),
        )
