"""The agent loop: sample the GPUs, send heartbeats, converge the containers to the control plane's reply.

``step()`` does whatever is due at the clock's time and says how long until the next thing is due, so tests
drive the agent without sleeping and ``run()`` is only a loop around it that stops on SIGTERM or SIGINT.

Fencing (DESIGN invariants 8 and 12, docs/agent.md): the control plane's reply gives a lease; with no answered
heartbeat for that long, the agent stops the containers the control plane would place elsewhere (``replaceable``),
because it may be about to start the same work there. The lease runs from the moment the last answered heartbeat was
*sent*, which is never later than the moment the control plane recorded it; the control plane waits the lease, the
stop grace and a margin for the loop's own delays before it requeues (controlplane/fleet/fencing.py). A lease
watchdog inside each replaceable container does the same when the agent itself cannot (nodeagent.runtime.watchdog).

Everything else runs through the silence: the agent goes on converging on the desired state it last heard (kept on
disk, so a restarted agent holds it too), ending each container at its window's end with the usual notice, and
stops it only once the silence outlasts the outage tolerance the control plane told it. A control plane that tells
no tolerance (older than it) has every container fenced at the lease, as before. What the agent would have reported
meanwhile waits in its journal (nodeagent.journal) and is replayed in order when the control plane answers again.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import nodeagent
from nodeagent import schema
from nodeagent.backends.base import GpuBackend
from nodeagent.client import Backoff, ControlPlaneClient, CredentialRevoked, Rejected, Unreachable
from nodeagent.collectors import EventCollector, GpuCollector, HostCollector
from nodeagent.commands import CommandChannel, next_due
from nodeagent.journal import Journal
from nodeagent.mig import MigResult
from nodeagent.runtime.base import ContainerRuntime
from nodeagent.volumes import VolumeStore

if TYPE_CHECKING:
    from nodeagent.gateway import SshGateway
    from nodeagent.runtime.images import ImagePuller, PrePuller

log = logging.getLogger(__name__)

# A control plane that asks for a silly interval is not obeyed to the letter.
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.5, 600.0
# Near the fence, a heartbeat's connect and read timeouts are cut to half the time left each, but not below this.
MIN_REQUEST_TIMEOUT_S = 0.5
# A SIGKILL the runtime could not send when due is tried again this much later.
KILL_RETRY_S = 1.0
# While the journal holds a backlog (a replay after an outage), the next heartbeat goes this soon, not an
# interval later, so hours of samples catch up in minutes.
REPLAY_INTERVAL_S = 0.5
# Past the lease, retries back off to at most this (or the heartbeat interval, if longer): a control plane back
# from an outage hears from every agent, and from its journal what ran meanwhile, well within its startup grace
# (FLEET_STARTUP_GRACE_S, 60 s).
OUTAGE_RETRY_S = 15.0


class Clock(Protocol):
    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class AgentStopped(Exception):
    """The agent cannot go on; the message tells the operator what to do."""

    def __init__(self, message: str, *, exit_code: int = 3) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class AgentState:
    """What survives a restart: the node credential (mode 0600) and the last heartbeat sequence number."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    @property
    def credential_path(self) -> Path:
        return self.directory / "credential"

    def credential(self) -> str | None:
        try:
            mode = self.credential_path.stat().st_mode & 0o777
            value = self.credential_path.read_text().strip()
        except FileNotFoundError:
            return None
        if mode & 0o077:
            log.warning("%s is readable by others (mode %o); it should be 0600", self.credential_path, mode)
        return value or None

    def save_credential(self, credential: str) -> None:
        self._write("credential", credential + "\n")

    def revoke(self) -> Path:
        """Set a revoked credential aside, so the next start with a join token enrolls afresh."""
        target = self.directory / "credential.revoked"
        if self.credential_path.exists():
            os.replace(self.credential_path, target)
        return target

    def seq(self) -> int:
        try:
            return int((self.directory / "seq").read_text().strip())
        except (FileNotFoundError, ValueError):
            return 0

    def save_seq(self, seq: int) -> None:
        self._write("seq", f"{seq}\n")

    def lease(self) -> tuple[datetime, float, float | None] | None:
        """When the last answered heartbeat was sent (wall clock), the lease it earned and the outage tolerance it
        told (None: none), or None."""
        try:
            saved = json.loads((self.directory / "lease").read_text())
            tolerance = saved.get("outage_tolerance_s")
            return (
                datetime.fromisoformat(saved["renewed_at"]),
                float(saved["lease_s"]),
                None if tolerance is None else float(tolerance),
            )
        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def save_lease(self, renewed_at: datetime, lease_s: float, outage_tolerance_s: float | None = None) -> None:
        # Kept on disk so that a restarted agent cannot lengthen its lease (nor its tolerance): the control plane
        # counts from the same heartbeat whether or not the agent restarted.
        saved = {"renewed_at": renewed_at.isoformat(), "lease_s": lease_s, "outage_tolerance_s": outage_tolerance_s}
        self._write("lease", json.dumps(saved) + "\n")

    def clear_lease(self) -> None:
        (self.directory / "lease").unlink(missing_ok=True)

    def desired(self) -> tuple[list[schema.DesiredContainer], list[str]] | None:
        """The desired state of the last answered heartbeat, or None when none was kept (or it does not parse)."""
        try:
            saved = json.loads((self.directory / "desired.json").read_text())
            desired = [schema.DesiredContainer.model_validate(item) for item in saved["desired"]]
            return desired, [str(launch_id) for launch_id in saved["stop"]]
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def save_desired(self, text: str) -> None:
        # Mode 0600 like the credential, in the agent's 0700 directory: a launch carries its project's secrets and
        # registry credentials.
        self._write("desired.json", text)

    @staticmethod
    def desired_text(desired: list[schema.DesiredContainer], stop: list[str]) -> str:
        return json.dumps({"desired": [d.model_dump(mode="json") for d in desired], "stop": stop}) + "\n"

    def _write(self, name: str, text: str) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The directory too is the agent's alone (0700), whoever created it first (the container runtime's and the
        # journal's directories live in it): the desired state it holds carries the launches' secrets.
        if self.directory.stat().st_mode & 0o077:
            os.chmod(self.directory, 0o700)
        tmp = self.directory / f".{name}.tmp"
        # Created 0600 from the start: the secret is never readable by others, not even for a moment.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / name)


class Agent:
    """One node's agent. Everything it talks to is passed in."""

    def __init__(
        self,
        *,
        client: ControlPlaneClient,
        backend: GpuBackend,
        runtime: ContainerRuntime,
        state: AgentState,
        host: HostCollector | None = None,
        join_token: str | None = None,
        interval: float = 5.0,
        sample_interval: float = 1.0,
        max_batch_samples: int = 1024,
        clock: Clock | None = None,
        buffer: Journal | None = None,
        backoff: Backoff | None = None,
        commands: CommandChannel | None = None,
        volumes: VolumeStore | None = None,
        gateway: SshGateway | None = None,
        prepull_workers: int = 2,
    ) -> None:
        self.client = client
        self.backend = backend
        self.runtime = runtime
        self.state = state
        self.host = host or HostCollector()
        self.gpus = GpuCollector(backend)
        self.events = EventCollector(backend)
        self.join_token = join_token
        self.interval = interval
        self.sample_interval = sample_interval
        self.max_batch_samples = max_batch_samples
        self.clock = clock or SystemClock()
        # The journal (nodeagent.journal) behind every heartbeat: what is not yet answered waits there, on disk.
        self.buffer = buffer if buffer is not None else Journal(state.directory / "journal")
        self.backoff = backoff or Backoff(base_s=2.0, cap_s=60.0)
        self.credential = state.credential()
        if self.credential is None and not join_token:
            raise AgentStopped(
                f"no node credential in {state.directory} and no join token: enroll this node with "
                "--join-token (an operator creates one in the control plane)",
                exit_code=2,
            )
        self.seq = state.seq()
        self.server_name: str | None = None
        self.server_state: str | None = None
        self.last_reply: schema.HeartbeatReply | None = None
        self._last_reports: list[schema.ContainerReport] = []
        # Per launch, what its last journaled report said, so only a change (a start, an exit) is journaled.
        self._journaled: dict[str, tuple[object, ...]] = {}
        start = self.clock.monotonic()
        self._next_sample = start
        self._next_heartbeat = start
        # Fencing: the lease the control plane gave (None: it gives none, and the agent never fences), the outage
        # tolerance it told (None: it told none, and every container is fenced at the lease), the monotonic time
        # the last answered heartbeat was sent, why the node is fenced while it is, and whether the fence covers
        # every container (the tolerance ran out too) or only the replaceable ones.
        self.lease_s: float | None = None
        self.outage_tolerance_s: float | None = None
        self._renewed_at: float | None = None
        self.fenced: str | None = None
        self.fenced_all = False
        saved = state.lease()
        if saved is not None:
            renewed_at, self.lease_s, self.outage_tolerance_s = saved
            # The monotonic clock starts again with the process; the wall clock says how much of the lease is gone.
            self._renewed_at = start - max(0.0, (self.clock.now() - renewed_at).total_seconds())
        self._stop = threading.Event()
        # GPU uuid -> the MIG request generation last answered, so a resent request is not applied twice.
        self._mig_answered: dict[str, int] = {}
        # Pushed commands (see nodeagent.commands), the desired state last applied, and the monotonic time
        # of the next window start, warning or stop the runtime must act on between heartbeats.
        self.commands = commands
        # The node's volume root, when it has one: its usage measurements ride on the heartbeats.
        self.volumes = volumes
        # The desired state last heard, kept on disk: a restarted agent acts on it as soon as the control plane
        # does not answer (``_held`` until then), so its containers still end at their windows' ends.
        held = state.desired()
        self._desired: tuple[list[schema.DesiredContainer], list[str]] = held or ([], [])
        self._desired_text = AgentState.desired_text(*held) if held is not None else None
        self._held = held is not None
        self._next_due: float | None = None
        # A runtime that creates and starts containers in the background pokes the loop when one finished,
        # so a container created ahead of its window is started at once, not at the next heartbeat.
        self._poked = threading.Event()
        self._wakeup = threading.Event()
        # The SSH gateway (nodeagent.gateway), told each desired state after the runtime converged to it. Its
        # session events come from its own thread, so they wait in a queue until the loop moves them to the
        # buffer (which only the loop thread touches).
        self.gateway = gateway
        self._posted: queue.SimpleQueue[schema.AgentEvent] = queue.SimpleQueue()
        # A runtime that pulls images (nodeagent.runtime.images): the reply's pre-pulls are pulled in the
        # background, and every pull's outcome rides on the heartbeats until one is answered.
        self.images: ImagePuller | None = getattr(runtime, "images", None)
        self.prepuller: PrePuller | None = None
        if self.images is not None:
            from nodeagent.runtime.images import PrePuller  # the Docker SDK: only with a runtime that pulls

            self.prepuller = PrePuller(self.images, workers=prepull_workers)
        set_waker = getattr(runtime, "set_waker", None)
        if set_waker is not None:
            set_waker(self._runtime_finished)

    # -- the loop -------------------------------------------------------------------------------------------

    def step(self) -> float:
        """Do what is due now; the seconds until something is due next."""
        mono, now = self.clock.monotonic(), self.clock.now()
        self._drain_posted()
        if self.credential is None or mono < self._next_heartbeat:
            # With a heartbeat due, it goes first: a loop held up past the lease (a slow engine) asks the control
            # plane before it fences. If that heartbeat fails, the check after it fences, a request's time later.
            self._check_lease(mono, now)
        if self.commands is not None:
            for command in self.commands.take():
                self.commands.remember(command, seq=self.seq)
                log.info("applying pushed command %s (%s)", command.command_id, command.reason)
                self._converge(*self._desired, now, reply_seq=None)
        if self._poked.is_set():
            self._poked.clear()
            self._converge(*self._desired, now, reply_seq=None)
        if mono >= self._next_sample:
            self._sample(now)
            self._next_sample += self.sample_interval
            if self._next_sample <= mono:  # fell behind (a slow heartbeat): skip, never burst
                self._next_sample = mono + self.sample_interval
        if mono >= self._next_heartbeat:
            if self.credential is None:
                self._enroll(now, mono)
            if self.credential is not None and mono >= self._next_heartbeat:
                renewed = self._renewed_at
                self._heartbeat(now, mono)
                if self._renewed_at == renewed:  # not answered: it may have taken the rest of the lease
                    self._check_lease(self.clock.monotonic(), self.clock.now())
        if self._next_due is not None and self.clock.monotonic() >= self._next_due:
            self._converge(*self._desired, self.clock.now(), reply_seq=None)
        due = [self._next_sample, self._next_heartbeat]
        due += [moment for moment in (self._next_due, self._fence_deadline()) if moment is not None]
        return max(0.0, min(due) - self.clock.monotonic())

    def run(self) -> None:
        """Step until stopped by ``stop()``, SIGTERM or SIGINT. Raises ``AgentStopped`` when it cannot go on."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        log.info(
            "node agent %s: %s backend, %d GPUs",
            nodeagent.__version__,
            self.backend.name,
            len(self.gpus.facts(self.clock.now())),
        )
        try:
            while not self._stop.is_set():
                timeout = self.step()
                if self.commands is not None:
                    self.commands.wait(timeout)  # a pushed command wakes the loop at once
                else:
                    self._wakeup.wait(timeout)
                    self._wakeup.clear()
        finally:
            self.backend.close()
            self.buffer.sync()  # a clean stop leaves the journal on disk, durable, for the next start
            close = getattr(self.runtime, "close", None)
            if close is not None:
                close()
            if self.prepuller is not None:
                self.prepuller.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        log.info("node agent stopped")

    def stop(self) -> None:
        self._stop.set()
        self._wake()

    def post_event(self, event: schema.AgentEvent) -> None:
        """Queue an event for the next heartbeat; safe from any thread (the SSH gateway's ``on_session``)."""
        self._posted.put(event)

    def _drain_posted(self) -> None:
        events = []
        while True:
            try:
                events.append(self._posted.get_nowait())
            except queue.Empty:
                break
        if events:
            self.buffer.add_events(events)

    def _wake(self) -> None:
        self._wakeup.set()
        if self.commands is not None:
            self.commands.wake()

    def _runtime_finished(self) -> None:
        self._poked.set()
        self._wake()

    def _on_signal(self, signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        self.stop()

    # -- the work -------------------------------------------------------------------------------------------

    def _sample(self, now: datetime) -> None:
        reading = self.gpus.collect(now)
        self.buffer.add_samples(reading.samples)
        self.buffer.add_events(reading.events + self.events.collect(now))

    def _enroll(self, now: datetime, mono: float) -> None:
        assert self.join_token
        request = schema.EnrollRequest(
            join_token=self.join_token, hostname=self.host.collect().hostname, simulated=self.backend.simulated
        )
        try:
            reply = self.client.enroll(request)
        except Rejected as exc:
            raise AgentStopped(
                f"the control plane refused to enroll this node: {exc.message} "
                "(a join token works once and expires; ask an operator for a new one)"
            ) from exc
        except Unreachable as exc:
            delay = self.backoff.failure()
            log.warning("enrollment failed, retrying in %.1f s: %s", delay, exc)
            self._next_heartbeat = mono + delay
            return
        self.backoff.reset()
        self.state.save_credential(reply.credential)
        self.credential = reply.credential
        self.server_name = reply.server
        self.interval = _clamp_interval(reply.heartbeat_interval_s)
        log.info("enrolled as server %s; credential saved in %s", reply.server, self.state.credential_path)

    def node_facts(self) -> schema.NodeFacts:
        host = self.host.collect()
        return schema.NodeFacts(
            hostname=host.hostname,
            agent_version=nodeagent.__version__,
            backend=self.backend.name,
            simulated=self.backend.simulated,
            driver_version=self.backend.driver_version,
            cuda_version=self.backend.cuda_version,
            cpu_count=host.cpu_count,
            memory_bytes=host.memory_bytes,
            numa_cpus=host.numa_cpus,
            container_runtime=self.runtime.facts(),
            command_url=self.commands.url if self.commands is not None else None,
            fencing=True,
            outage_tolerant=True,
            volumes=self.volumes is not None,
            ssh=self.gateway.facts() if self.gateway is not None else None,
            pulls=self.images is not None,
            image_cache_bytes=self.images.cache.budget_bytes if self.images is not None else None,
        )

    def _container_reports(self, now: datetime) -> list[schema.ContainerReport]:
        # An empty list would read as "nothing runs here"; when the engine cannot be asked, repeat what it
        # last said and report the failure instead.
        try:
            self._last_reports = self.runtime.report()[: schema.MAX_CONTAINERS]
        except Exception as exc:
            log.exception("asking the container runtime for its containers failed")
            self.buffer.add_events(
                [schema.AgentEvent(kind="error", ts=now, message=f"container report failed: {exc}"[:2000])]
            )
            return self._last_reports
        # A start or an exit goes into the journal as well: the runtime forgets a finished launch once the
        # desired state lets go of it, and the report must still reach a control plane that was away then.
        fresh = []
        for report in self._last_reports:
            key = (
                report.state,
                report.container_id,
                report.started_at,
                report.finished_at,
                report.exit_code,
                report.fenced,
            )
            if self._journaled.get(report.launch_id) != key:
                self._journaled[report.launch_id] = key
                fresh.append(report)
        self.buffer.add_containers(fresh)
        return self._last_reports

    def _heartbeat(self, now: datetime, mono: float) -> None:
        assert self.credential
        current = self._container_reports(now)  # before take: it may add an event to the journal
        batch = self.buffer.take(
            max_samples=self.max_batch_samples, now=now, max_containers=schema.MAX_CONTAINERS - len(current)
        )
        # What runs now speaks for its launch; a journaled report speaks for a launch the runtime has forgotten
        # since (the latest of the batch per launch; the control plane never moves a launch backwards).
        replayed = {r.launch_id: r for r in batch.containers if r.launch_id not in {c.launch_id for c in current}}
        containers = [*current, *replayed.values()]
        volumes = self.volumes.unsent() if self.volumes is not None else []
        images = self.images.board.unsent() if self.images is not None else []
        self.seq += 1
        self.state.save_seq(self.seq)
        heartbeat = schema.Heartbeat(
            seq=self.seq,
            sent_at=now,
            node=self.node_facts(),
            gpus=self.gpus.facts(now),
            samples=schema.series_from_samples(batch.samples),
            events=batch.events,
            containers=containers,
            volumes=volumes,
            images=images,
        )
        try:
            reply = self.client.heartbeat(
                self.credential, heartbeat, timeout=self._request_timeout(self.clock.monotonic(), self.clock.now())
            )
        except CredentialRevoked as exc:
            kept = self.state.revoke()
            raise AgentStopped(
                f"the control plane no longer accepts this node's credential ({exc.message}); it was moved to "
                f"{kept}. Re-enroll with a new --join-token."
            ) from exc
        except Rejected as exc:
            if exc.status == 413 and len(batch.samples) > 1:
                self.max_batch_samples = max(1, len(batch.samples) // 2)
                log.warning(
                    "heartbeat too large for the control plane; sending %d samples at a time", self.max_batch_samples
                )
            else:
                log.error(
                    "the control plane rejected heartbeat %d (%s); its %d samples and %d events are "
                    "dropped because they would never be accepted",
                    self.seq,
                    exc,
                    len(batch.samples),
                    len(batch.events),
                )
                self.buffer.commit(batch)
                self._volumes_sent(volumes)
                self._images_sent(images)
            self._next_heartbeat = mono + self.interval
            return
        except Unreachable as exc:
            delay = self.backoff.failure()
            if self._lease_deadline() is not None:
                # While the lease runs, retry at the usual cadence: a control plane back within the lease renews
                # it in time, and the containers keep running.
                delay = min(delay, self.interval)
            elif self.lease_s is not None:
                delay = min(delay, max(self.interval, OUTAGE_RETRY_S))
            log.warning(
                "heartbeat %d failed (%d in a row), retrying in %.1f s; %d samples journaled: %s",
                self.seq,
                self.backoff.failures,
                delay,
                self.buffer.pending("samples"),
                exc,
            )
            self.buffer.sync()
            self._next_heartbeat = mono + delay
            if self._held:
                # A restarted agent that cannot reach the control plane runs on the desired state it holds.
                self._held = False
                self._converge(*self._desired, now, reply_seq=None)
            return
        self.buffer.commit(batch)
        self._volumes_sent(volumes)
        self._images_sent(images)
        self.backoff.reset()
        self.last_reply = reply
        self.server_name, self.server_state = reply.server, reply.server_state
        self.interval = _clamp_interval(reply.heartbeat_interval_s)
        backlog = self.buffer.pending("samples") + self.buffer.pending("events") + self.buffer.pending("containers")
        self._next_heartbeat = mono + (min(self.interval, REPLAY_INTERVAL_S) if backlog else self.interval)
        self._renew(reply.lease_s, reply.outage_tolerance_s, now, mono)
        self._held = False
        self._hold(reply.desired, reply.stop)
        self._converge(reply.desired, reply.stop, now, reply_seq=self.seq)
        if reply.mig:
            self.apply_mig(reply.mig, now)
        if self.prepuller is not None:
            try:
                self.prepuller.update(reply.prepull, now)
            except Exception:  # the next reply lists them again
                log.exception("starting the pre-pulls failed")

    def _volumes_sent(self, volumes: list[schema.VolumeUsage]) -> None:
        # Only an answered heartbeat takes measurements off the queue; an unanswered one leaves them for the next.
        if self.volumes is not None:
            self.volumes.sent(volumes)

    def _images_sent(self, images: list[schema.ImageReport]) -> None:
        # Like the volume measurements: only an answered heartbeat takes the image reports off the board.
        if self.images is not None:
            self.images.board.sent(images)

    # -- fencing --------------------------------------------------------------------------------------------

    def _lease_deadline(self) -> float | None:
        """The monotonic time the lease runs out, while it runs; None when fenced or without a lease."""
        if self.fenced is not None or self.lease_s is None or self._renewed_at is None:
            return None
        return self._renewed_at + self.lease_s

    def _fence_deadline(self) -> float | None:
        """The monotonic time the next fence is due: the lease's end, then (fenced, replaceable work only) the
        outage tolerance's; None when nothing is left to fence or there is no lease."""
        lease = self._lease_deadline()
        if lease is not None:
            return lease
        if self.fenced is None or self.fenced_all or self.outage_tolerance_s is None or self._renewed_at is None:
            return None
        return self._renewed_at + self.outage_tolerance_s

    def _check_lease(self, mono: float, now: datetime) -> None:
        deadline = self._fence_deadline()
        if deadline is not None and mono >= deadline:
            assert self.lease_s is not None and self._renewed_at is not None
            tolerance = self.outage_tolerance_s
            # No tolerance told (an older control plane): every container goes at the lease, as it always did.
            everything = tolerance is None or mono - self._renewed_at >= tolerance
            self._fence(now, mono, everything=everything)

    def _fence(self, now: datetime, mono: float, *, everything: bool) -> None:
        """No answered heartbeat for the lease: stop the replaceable containers before the control plane requeues
        them; ``everything``: the others too (the silence outlasted the outage tolerance, or none was told)."""
        assert self.lease_s is not None and self._renewed_at is not None
        silent = mono - self._renewed_at
        if everything and self.outage_tolerance_s is not None:
            limit = f"outage tolerance {self.outage_tolerance_s:g} s"
        else:
            limit = f"lease {self.lease_s:g} s"
        reason = f"fenced: no reply from the control plane for {silent:.1f} s ({limit})"
        self.fenced, self.fenced_all = reason, everything
        if everything:
            what = "this node's containers are being stopped"
        else:
            what = (
                "this node's replaceable containers are being stopped; the others run on, to their windows' ends "
                f"or for {self.outage_tolerance_s:g} s of silence"
            )
        log.warning("%s; %s", reason, what)
        self.buffer.add_events([schema.AgentEvent(kind="agent", ts=now, message=f"{reason}; {what}"[:2000])])
        try:
            self.runtime.fence(now, reason, replaceable_only=not everything)
        except Exception as exc:  # the reconciles that follow fence what is still running
            log.exception("fencing the containers failed")
            self.buffer.add_events(
                [schema.AgentEvent(kind="error", ts=now, message=f"fencing the containers failed: {exc}"[:2000])]
            )
        # Fenced, the runtime starts nothing fenced; this reconcile arms the timer for the SIGKILLs after the grace.
        self._held = False
        self._converge(*self._desired, now, reply_seq=None)

    def _renew(self, lease_s: float | None, tolerance_s: float | None, now: datetime, mono: float) -> None:
        """An answered heartbeat, sent at ``mono`` (``now``): the lease starts again from then, the lease watchdogs
        of replaceable containers are told its new end, and a fence is lifted."""
        if lease_s is None:
            if self.lease_s is not None:
                log.warning("the control plane gives this node no lease any more: it will not fence itself")
                self.state.clear_lease()
            self.lease_s = self._renewed_at = self.outage_tolerance_s = None
        else:
            self.lease_s, self.outage_tolerance_s, self._renewed_at = lease_s, tolerance_s, mono
            self.state.save_lease(now, lease_s, tolerance_s)
        renew = getattr(self.runtime, "renew_lease", None)
        if renew is not None:
            try:
                renew(None if lease_s is None else now + timedelta(seconds=lease_s))
            except Exception:  # the watchdogs stop their jobs at the old deadline; the agent would fence them too
                log.exception("renewing the lease watchdogs' deadline failed")
        if self.fenced is not None:
            log.info("the control plane answers again; the fence is lifted (%s)", self.fenced)
            self.buffer.add_events(
                [schema.AgentEvent(kind="agent", ts=now, message=f"the control plane answers again; was {self.fenced}")]
            )
            self.fenced, self.fenced_all = None, False
            self.runtime.unfence()

    def _request_timeout(self, mono: float, now: datetime) -> tuple[float, float] | None:
        """The heartbeat's timeouts, so that a request into a dead network returns before the fence is due (or,
        fenced, before a container's SIGKILL or the tolerance's fence is); None: the client's own."""
        deadlines = [self._fence_deadline()]
        if self.fenced is not None:
            kill = self._next_kill_at(now)
            deadlines.append(None if kill is None else mono + (kill - now).total_seconds())
        deadline = min((d for d in deadlines if d is not None), default=None)
        if deadline is None:
            return None
        each = max(MIN_REQUEST_TIMEOUT_S, (deadline - mono) / 2)
        return None if each >= self.client.timeout else (each, each)

    def _next_kill_at(self, now: datetime) -> datetime | None:
        try:
            kill = self.runtime.next_kill_at()
        except Exception:
            log.exception("asking the container runtime for its next SIGKILL failed")
            return now + timedelta(seconds=KILL_RETRY_S)
        if kill is not None and kill <= now:
            return now + timedelta(seconds=KILL_RETRY_S)  # due and not sent: the engine did not take it
        return kill

    def _hold(self, desired: list[schema.DesiredContainer], stop: list[str]) -> None:
        """Keep a reply's desired state on disk (when it changed), for an agent restarted while the control plane
        is away."""
        text = AgentState.desired_text(desired, stop)
        if text != self._desired_text:
            try:
                self.state.save_desired(text)
            except OSError:
                log.exception("keeping the desired state in %s failed", self.state.directory)
                return
            self._desired_text = text

    def _converge(
        self, desired: list[schema.DesiredContainer], stop: list[str], now: datetime, *, reply_seq: int | None
    ) -> None:
        """Apply a reply's (or the last) desired state merged with pushed commands, and time the next act."""
        self._desired = (desired, stop)
        if self.commands is not None:
            desired, stop = self.commands.merge(desired, stop, reply_seq=reply_seq)
        self.apply_desired(desired, stop, now)
        if self.gateway is not None:
            try:
                self.gateway.update(desired, stop, now)
            except Exception as exc:  # the gateway keeps its last table; the next converge tries again
                log.exception("updating the SSH gateway failed")
                self.buffer.add_events(
                    [schema.AgentEvent(kind="error", ts=now, message=f"updating the SSH gateway failed: {exc}"[:2000])]
                )
        moments = [moment for moment in (next_due(desired, now), self._next_kill_at(now)) if moment is not None]
        due = min(moments, default=None)
        self._next_due = None if due is None else self.clock.monotonic() + max(0.0, (due - now).total_seconds())

    def apply_desired(self, desired: list[schema.DesiredContainer], stop: list[str], now: datetime) -> None:
        """Converge the runtime to a desired state, from a heartbeat reply or a pushed command."""
        try:
            self.runtime.reconcile(desired, stop, now)
        except Exception as exc:  # a runtime bug must not stop the agent's reporting; the next reply retries
            log.exception("reconciling containers failed")
            self.buffer.add_events(
                [schema.AgentEvent(kind="error", ts=now, message=f"reconciling containers failed: {exc}"[:2000])]
            )

    def apply_mig(self, wanted: list[schema.DesiredMig], now: datetime) -> None:
        """Give GPUs the MIG layouts the control plane asks for, each only while none of our containers uses the
        GPU or one of its MIG devices; the outcome goes back as a "mig" event naming the request's generation.

        A layout the GPU already has is reported applied without touching it: recreating the instances would
        give them new MIG uuids, and the control plane resends the request until it hears the outcome."""
        facts = {g.uuid: g for g in self.gpus.facts(now)}
        try:
            busy = self.runtime.busy_gpus()
        except Exception:  # without knowing, nothing is reconfigured; the next reply asks again
            log.exception("asking the runtime which GPUs are busy failed")
            return
        changed = False
        for request in wanted:
            if self._mig_answered.get(request.uuid) == request.generation:
                continue
            gpu = facts.get(request.uuid)
            mine = {request.uuid} | {d.uuid for d in (gpu.mig.devices if gpu and gpu.mig else [])}
            if mine & busy:
                continue  # drained by the control plane, but a container still stops: try on the next reply
            if gpu is not None and gpu.mig is not None and _has_layout(gpu.mig, request):
                result = MigResult("applied", "the GPU already has this MIG layout")
            else:
                try:
                    result = self.backend.configure_mig(request.uuid, enabled=request.enabled, layout=request.layout)
                except Exception as exc:  # a backend bug is a refusal the operator sees, not a dead agent
                    log.exception("reconfiguring MIG on %s failed", request.uuid)
                    result = MigResult("refused", f"the agent failed to reconfigure MIG: {exc}"[:2000])
                changed = True
            log.info("MIG on %s (request %d): %s, %s", request.uuid, request.generation, result.outcome, result.message)
            self._mig_answered[request.uuid] = request.generation
            self.buffer.add_events(
                [
                    schema.AgentEvent(
                        kind="mig",
                        ts=now,
                        uuid=request.uuid,
                        generation=request.generation,
                        outcome=result.outcome,
                        message=result.message[:2000],
                    )
                ]
            )
        if changed:
            self.gpus.rediscover()


def _has_layout(state: schema.MigState, request: schema.DesiredMig) -> bool:
    if state.current != request.enabled or state.pending != request.enabled:
        return False
    return sorted(d.profile or "" for d in state.devices) == sorted(request.layout)


def _clamp_interval(seconds: float) -> float:
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, seconds))
