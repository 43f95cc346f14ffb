"""The Docker container runtime: launches each reservation's container on exactly its GPUs, warns it before
the window closes, stops it (SIGTERM, then SIGKILL after a grace) and reports what Docker saw.

Docker itself is the record of what runs: every container of ours carries labels naming its launch, so a
restarted agent adopts what it finds instead of launching twice. A small directory per launch under the state
directory keeps the few facts Docker cannot (warning sent, stop deadline, final report). ``reconcile`` never
waits on a container: a stop sends SIGTERM and records a deadline, and a later reconcile past the deadline
sends SIGKILL, so a 1-5 s heartbeat loop is never held up by a slow job.

Launch latency: creating a container (its file system, its config) is the slow part of `docker run`, so a
launch that arrives ahead of its window (the control plane sends it ``DISPATCH_LEAD_S`` early) is created
then, in a small pool of worker threads, and only started at ``window_start``. Creations never hold up the
loop; starts (fast) run in parallel and are waited for only until the next window of another launch opens.
See docs/runtime.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from requests.exceptions import RequestException

from nodeagent import schema
from nodeagent.runtime import resources, secrets, watchdog
from nodeagent.runtime.containers import (
    ERROR_CHARS,
    LABEL_CPUSET,
    LABEL_GPUS,
    LABEL_GRACE,
    LABEL_LAUNCH,
    LABEL_NODE,
    LABEL_REPLACEABLE,
    LABEL_RESERVATION,
    Launch,
    container_name,
    create_args,
    detect_nvidia_runtime,
    iso,
    launch_report,
    parse_docker_time,
    safe_id,
)
from nodeagent.runtime.devices import AmdDevices, DeviceError, GpuInfo, amd_devices
from nodeagent.runtime.images import PULL_STALL_S, PULL_TIMEOUT_S, ImagePuller, PullFailed, make_puller, repo_digest
from nodeagent.runtime.mounts import LaunchRefused, mounts_for, network_for
from nodeagent.volumes import VolumeStore

log = logging.getLogger(__name__)

CONFLICT_WAIT_S = 10.0
# Under the state directory: the ulimits the engine could not raise (a JSON list of names).
ULIMITS_REFUSED_FILE = "ulimits-refused.json"
# How often one launch is created again without a ulimit the engine refused, before its start fails for good.
MAX_ULIMIT_RETRIES = 3
# How long before its window a launch's container is created (not started).
PREPARE_AHEAD_S = 30.0
# The longest a reconcile waits for its starts when no other window is about to open.
MAX_START_WAIT_S = 30.0

# Docker states in which the container's process may still hold its GPUs.
LIVE_STATES = frozenset({"created", "running", "paused", "restarting"})
SIGNALLABLE_STATES = frozenset({"running", "paused", "restarting"})


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Outcome:
    """What a worker thread's create or start came to; applied to the launch by the reconciling thread."""

    container: Container | None = None
    failure: str | None = None
    # The container is gone (removed by the worker after a refused start, or by someone else).
    gone: bool = False
    started: bool = False
    # The image is not on the node: the launch's pull comes next (in the pull pool), then the create again.
    needs_pull: bool = False
    # A pull for the launch finished (``failure`` says when it failed).
    pulled: bool = False
    # The repository digest of the launch's image, once known.
    digest: str | None = None
    # The engine could not raise this ulimit (it lacks the privilege to): create the container again without it.
    ulimit_refused: str | None = None


class DockerRuntime:
    """The agent's container runtime on a Docker engine. Follows ``nodeagent.runtime.base.ContainerRuntime``.

    ``node`` names this agent in the ``gpucp.node`` label, so several agents may share one engine (the
    demo's simulated fleet does) without touching each other's containers. ``gpu_info`` gives a GPU's vendor and
    PCI bus, so AMD launches get their render nodes (found under ``sysfs_root``). ``gpu_numa`` maps a GPU uuid to
    its NUMA node and ``numa_cpus`` a NUMA node to its CPU list; with both known, the container is pinned
    to those CPUs. ``nvidia_runtime`` None means: ask the engine. ``volumes`` is the node's volume root
    (None: launches that mount volumes or datasets are refused). ``network_mode`` is what a launch without
    egress gets.
    """

    def __init__(
        self,
        *,
        state_dir: Path | str,
        client: docker.DockerClient | None = None,
        node: str | None = None,
        numa_cpus: Mapping[str, str] | None = None,
        gpu_numa: Mapping[str, int | None] | Callable[[str], int | None] | None = None,
        nvidia_runtime: bool | None = None,
        network_mode: str = "none",
        default_memory_limit_mib: int | None = None,
        default_pids_limit: int | None = 4096,
        remove_after_reports: int = 2,
        clock: Callable[[], datetime] = _utcnow,
        prepare_ahead_s: float = PREPARE_AHEAD_S,
        workers: int = 4,
        volumes: VolumeStore | None = None,
        gpu_info: Callable[[str], GpuInfo | None] | None = None,
        sysfs_root: Path | str = "/sys",
        lease_dir: Path | str | None = None,
        busybox: Path | str | bool | None = True,
        registry_mirrors: Mapping[str, str] | None = None,
        image_cache_bytes: int | None = None,
        pull_timeout_s: float = PULL_TIMEOUT_S,
        pull_stall_s: float = PULL_STALL_S,
        pull_workers: int = 2,
        puller: ImagePuller | None = None,
    ) -> None:
        self.client = client if client is not None else docker.from_env(timeout=30)
        self.node = node or socket.gethostname()
        self.state_dir = Path(state_dir)
        self.launch_root = self.state_dir / "launches" / safe_id(self.node)
        self.launch_root.mkdir(parents=True, exist_ok=True)
        # The ulimits this engine turned out unable to raise (``_ulimit_refused``), kept across restarts.
        self._ulimits_refused: set[str] = set()
        with contextlib.suppress(OSError, ValueError, TypeError):
            self._ulimits_refused = {str(n) for n in json.loads((self.state_dir / ULIMITS_REFUSED_FILE).read_text())}
        # The lease watchdog of replaceable launches (nodeagent.runtime.watchdog): the directory the agent renews
        # the deadline in, and the static busybox it runs under (True: the host's, if any; False: the image's sh).
        self.lease_dir = Path(lease_dir) if lease_dir is not None else watchdog.lease_dir(self.state_dir)
        self.lease_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.lease_dir, 0o755)  # noqa: S103 - read by the job, whatever its user; nothing secret here
        if busybox is True:
            self.busybox: Path | None = watchdog.static_busybox()
        else:
            self.busybox = Path(busybox) if busybox else None
        # The lease's end the watchdogs read now: a replaceable container that exited after it, and not by our
        # hand, was stopped by its watchdog.
        self._lease_deadline = watchdog.read_deadline(self.lease_dir)
        self.numa_cpus = dict(numa_cpus or {})
        self._all_cpus: list[int] | None = None
        self._gpu_numa = gpu_numa
        # uuid -> vendor and PCI bus, so an AMD launch gets its render nodes; None: every GPU is NVIDIA's.
        self._gpu_info = gpu_info
        self.sysfs_root = Path(sysfs_root)
        self.nvidia_runtime = detect_nvidia_runtime(self.client) if nvidia_runtime is None else nvidia_runtime
        self.network_mode = network_mode
        self.volumes = volumes
        self.default_memory_limit_mib = default_memory_limit_mib
        self.default_pids_limit = default_pids_limit
        self.remove_after_reports = max(1, remove_after_reports)
        self.clock = clock
        self.prepare_ahead = timedelta(seconds=max(0.0, prepare_ahead_s))
        self._launches: dict[str, Launch] = {}
        self._version: str | None = None
        # Creates and starts in flight, by launch id. Only the reconciling thread reads or changes this dict
        # and the launches; the workers only talk to the engine and return an _Outcome.
        self._ops: dict[str, Future[_Outcome]] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="docker-launch")
        # Pulls (nodeagent.runtime.images) run in a pool of their own, so a long pull never holds up another
        # launch's create or start. Their progress, by launch id, is written by the pulling thread.
        self.images = puller or make_puller(
            self.client,
            state_dir=self.state_dir,
            mirrors=registry_mirrors,
            cache_bytes=image_cache_bytes,
            timeout_s=pull_timeout_s,
            stall_s=pull_stall_s,
        )
        self._pull_pool = ThreadPoolExecutor(max_workers=max(1, pull_workers), thread_name_prefix="docker-pull")
        self._pull_progress: dict[str, schema.PullProgress] = {}
        self._waker: Callable[[], None] | None = None
        # While set (the reason), the node is fenced: see ``fence``. ``fence_all``: every launch is, not only the
        # replaceable ones.
        self.fenced: str | None = None
        self.fence_all = True
        self._adopt()

    def set_waker(self, waker: Callable[[], None] | None) -> None:
        """``waker`` is called (from a worker thread) when a create or start finished in the background, so
        the agent reconciles again at once instead of at its next heartbeat."""
        self._waker = waker

    def close(self) -> None:
        """Stop taking work; creates in flight finish on their own (a new runtime adopts what they made)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pull_pool.shutdown(wait=False, cancel_futures=True)

    # -- the ContainerRuntime protocol ---------------------------------------------------------------------

    def reconcile(self, desired: list[schema.DesiredContainer], stop: list[str], now: datetime) -> None:
        """Converge Docker to ``desired`` at ``now``: launch, warn, stop, escalate, clean up. Never blocks on a job."""
        stop_ids = set(stop)
        wanted = {d.launch_id: d for d in desired if d.launch_id not in stop_ids}
        self._collect_ops()
        self._refresh()

        for launch_id, spec in wanted.items():
            launch = self._launches.get(launch_id)
            if launch is None:
                launch = self._launches[launch_id] = self._new_launch(spec)
            launch.desired = spec
            launch.stop_grace_s = spec.stop_grace_s
            launch.replaceable = spec.replaceable
        for launch in self._launches.values():
            if launch.launch_id not in wanted:
                launch.desired = None
        if self.volumes is not None:
            self.volumes.track(wanted.values())
        # The images of the launches desired now stay out of the image cache's eviction.
        self.images.cache.need("launches", {spec.image for spec in wanted.values()})

        for launch in list(self._launches.values()):
            if launch.launch_id in self._ops:
                if launch.desired is not None and now >= launch.desired.window_start:
                    launch.prepared = False  # still pulling at its window: "creating", no longer "pending"
                continue  # a create or start in flight; the reconcile after it looks again
            status = launch.status
            if status in LIVE_STATES:
                if launch.desired is None or now >= launch.desired.window_end:
                    self._begin_stop(launch, now)
                elif (
                    self.fenced is not None
                    and self._is_fenced(launch)
                    and status in SIGNALLABLE_STATES
                    and launch.stop_deadline is None
                ):
                    self._fence_launch(launch, now, self.fenced)  # its start was in flight when the fence came
                elif launch.warned_for != iso(launch.desired.window_end) and now >= self._warn_at(launch.desired):
                    self._warn(launch, now)
            if launch.stop_deadline is not None and now >= launch.stop_deadline and status in SIGNALLABLE_STATES:
                self._kill(launch)

        if self.fenced is not None and self.fence_all:
            # Fenced: nothing starts, and nothing is removed, so every stopped container and its report are
            # still here when the control plane answers again.
            return

        # Earliest window first, then in the order the control plane listed (the sort is stable), so two
        # launches naming one GPU resolve the same way on every heartbeat: the first keeps it.
        starts: list[Future[_Outcome]] = []
        for spec in sorted(wanted.values(), key=lambda item: item.window_start):
            launch = self._launches[spec.launch_id]
            if launch.final is not None or launch.final_failure is not None or launch.launch_id in self._ops:
                continue
            if self._is_fenced(launch):
                continue  # replaceable work may be starting elsewhere; the rest runs through the outage
            if launch.container is None:
                op = self._launch(launch, spec, now)
                if op is not None and now >= spec.window_start:
                    starts.append(op)
            elif (
                launch.status == "created"
                and launch.stop_deadline is None
                and spec.window_start <= now < spec.window_end
            ):
                # Created ahead of the window, or by a runtime that died before starting it (or racing us):
                # starting is idempotent.
                launch.prepared = False
                starts.append(self._submit(launch, self._op_start, launch.container))

        if starts:
            # Starts run in parallel and are waited for, so the report that follows says "running"; but never
            # past the next window of another launch, which must not wait behind them.
            wait_futures(starts, timeout=self._start_budget(wanted.values(), now))
            self._collect_ops()
        if self.fenced is None:
            # While fenced, nothing is removed: a stopped container and its output stay until the control plane
            # has heard of them (the agent's journal keeps the reports too).
            self._collect_garbage()

    def _is_fenced(self, launch: Launch) -> bool:
        return self.fenced is not None and (self.fence_all or launch.replaceable)

    def _start_budget(self, specs: Iterable[schema.DesiredContainer], now: datetime) -> float:
        upcoming = [
            (spec.window_start - now).total_seconds()
            for spec in specs
            if spec.window_start > now and spec.launch_id not in self._ops
        ]
        return max(0.0, min([MAX_START_WAIT_S, *upcoming]))

    def fence(self, now: datetime, reason: str, *, replaceable_only: bool = False) -> None:
        """The node heard nothing from the control plane for its lease, which may be starting this work elsewhere:
        stop every running container of ours as at the end of a window (the notice in the warning file and
        SIGUSR1, then SIGTERM, then SIGKILL after the launch's grace), and start nothing until ``unfence``.

        ``replaceable_only``: only the replaceable launches are fenced (stopped, never started); the others run on
        and are converged as usual, to their window's end. A later call without it fences them too (the outage
        outlasted the control plane's tolerance).

        A container already being stopped (its window ended, a cancel) goes on as it was: its end is not the
        fence's. Each fenced launch is marked, on disk too, and reported with ``fenced`` and ``reason``. While
        fenced nothing is removed, so the reports wait for the control plane."""
        # First: should the engine fail below, every later reconcile still starts nothing and fences what runs.
        self.fenced = reason
        self.fence_all = not replaceable_only
        self._collect_ops()
        self._refresh()
        self._note_watchdog_stops()
        for launch in self._launches.values():
            # A start in flight is fenced by the reconcile that sees it running.
            if launch.launch_id in self._ops or launch.stop_deadline is not None or not self._is_fenced(launch):
                continue
            if launch.status in SIGNALLABLE_STATES:
                self._fence_launch(launch, now, reason)

    def unfence(self) -> None:
        """The control plane answered again: its desired state is the authority once more. A fenced launch stays
        stopped and keeps its mark; whether anything runs again is the reply's to say (a new launch, if so)."""
        self.fenced = None
        self.fence_all = True

    def renew_lease(self, deadline: datetime | None) -> None:
        """The agent's lease now ends at ``deadline`` (None: the control plane gives none): what the lease
        watchdogs of replaceable containers read (nodeagent.runtime.watchdog)."""
        self._note_watchdog_stops()  # against the deadline that was in force until now
        watchdog.write_deadline(self.lease_dir, deadline)
        self._lease_deadline = None if deadline is None else watchdog.read_deadline(self.lease_dir)

    def _note_watchdog_stops(self) -> None:
        """A replaceable container that exited at or after the lease's end, not stopped by us, was stopped by its
        watchdog (the agent was dead, frozen or cut off): it is reported fenced, as the agent's fence would have,
        so the control plane requeues it rather than taking its exit for the job's own end."""
        deadline = self._lease_deadline
        if deadline is None:
            return
        for launch in self._launches.values():
            if not launch.replaceable or launch.fenced is not None or launch.stop_deadline is not None:
                continue
            if launch.container is None or launch.status not in ("exited", "dead"):
                continue
            finished = parse_docker_time(launch.container.attrs.get("State", {}).get("FinishedAt"))
            if finished is None or finished < deadline:
                continue
            reason = f"fenced: stopped by its lease watchdog, the node agent's lease having run out at {iso(deadline)}"
            launch.fenced = reason[:ERROR_CHARS]
            (self._dir(launch.launch_id) / "fenced").write_text(launch.fenced + "\n")
            if launch.final is not None:
                launch.final = launch.final.model_copy(update={"fenced": True, "error": launch.final.error or reason})
                self._write_json(launch, "final.json", launch.final.model_dump(mode="json"))

    def next_kill_at(self) -> datetime | None:
        """When the next SIGKILL of a container being stopped is due (the end of its grace), if any: the agent
        reconciles then, also when no heartbeat reply comes (a fenced node gets none)."""
        due = [
            launch.stop_deadline
            for launch in self._launches.values()
            if launch.stop_deadline is not None
            and not launch.killed
            and launch.status in SIGNALLABLE_STATES
            and launch.launch_id not in self._ops
        ]
        return min(due, default=None)

    def busy(self) -> bool:
        """Whether a create or start is in flight."""
        return bool(self._ops)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is in flight (tests, and a clean shutdown); True when idle."""
        pending = list(self._ops.values())
        if pending:
            wait_futures(pending, timeout=timeout)
        return all(op.done() for op in pending)

    def report(self) -> list[schema.ContainerReport]:
        """One report per launch this runtime knows, as Docker sees it now."""
        reports: list[schema.ContainerReport] = []
        for launch in self._launches.values():
            if launch.container is not None:
                # A hiccup of the engine must not cost the heartbeat its report: say what was last seen.
                with contextlib.suppress(DockerException, RequestException):
                    launch.container.reload()
        self._note_watchdog_stops()
        for launch in sorted(self._launches.values(), key=lambda item: item.launch_id):
            launch.pull = self._pull_progress.get(launch.launch_id) if launch.launch_id in self._ops else None
            item = launch_report(launch)
            if item is None:
                continue
            if item.state in ("exited", "failed", "missing") and launch.blocked is None:
                launch.terminal_reports += 1
                if launch.final is None:
                    launch.final = item
                    self._write_json(launch, "final.json", item.model_dump(mode="json"))
            reports.append(item)
        return reports

    def facts(self) -> schema.ContainerRuntimeFacts:
        if self._version is None:
            try:
                self._version = str(self.client.version().get("Version") or "")[:256] or None
            except (DockerException, RequestException) as exc:
                return schema.ContainerRuntimeFacts(
                    kind="docker", gpu_mode="none", detail=f"the Docker engine is not reachable: {exc}"[:256]
                )
        if self.nvidia_runtime:
            return schema.ContainerRuntimeFacts(
                kind="docker",
                version=self._version,
                nvidia_runtime=True,
                gpu_mode="nvidia",
                detail=(
                    "GPUs are isolated by the NVIDIA container runtime (device requests by UUID)."
                    + self._ulimits_note()
                )[:256],
            )
        return schema.ContainerRuntimeFacts(
            kind="docker",
            version=self._version,
            nvidia_runtime=False,
            gpu_mode="env-only",
            detail=(
                "The host has no NVIDIA container runtime: GPUs are named by NVIDIA_VISIBLE_DEVICES only "
                "and are not isolated by the engine." + self._ulimits_note()
            )[:256],
        )

    def _ulimits_note(self) -> str:
        if not self._ulimits_refused:
            return ""
        names = ", ".join(sorted(self._ulimits_refused))
        return f" The engine cannot raise the {names} ulimit: containers get its own."

    def busy_gpus(self) -> set[str]:
        """GPUs bound to a running container of ours, as of the last reconcile or report."""
        busy: set[str] = set()
        for launch in self._launches.values():
            if launch.status in ("running", "restarting"):
                busy.update(launch.gpu_uuids)
        return busy

    # -- adoption and refresh ------------------------------------------------------------------------------

    def _ours(self) -> list[Container]:
        return self.client.containers.list(
            all=True, filters={"label": [LABEL_LAUNCH, f"{LABEL_NODE}={self.node}"]}, ignore_removed=True
        )

    def _adopt(self) -> None:
        """Take over the containers a previous runtime started on this engine, with their warning and stop state."""
        for container in self._ours():
            self._track_container(container)
        # A launch that finished and was removed keeps its final report until the desired state lets go of it;
        # without this a restarted agent would launch a finished job a second time.
        for launch_dir in self.launch_root.iterdir():
            final = self._read_json(launch_dir / "final.json")
            if final is None:
                continue
            report = schema.ContainerReport.model_validate(final)
            if report.launch_id in self._launches:
                continue
            launch = Launch(
                launch_id=report.launch_id,
                reservation=report.reservation,
                gpu_uuids=list(report.gpu_uuids),
                final=report,
                removed=True,
            )
            launch.terminal_reports = self.remove_after_reports
            self._launches[report.launch_id] = launch

    def _track_container(self, container: Container) -> Launch:
        labels = container.labels or {}
        launch_id = labels[LABEL_LAUNCH]
        launch = self._launches.get(launch_id)
        if launch is None:
            gpus = [g for g in (labels.get(LABEL_GPUS) or "").split(",") if g]
            launch = Launch(launch_id=launch_id, reservation=labels.get(LABEL_RESERVATION) or launch_id, gpu_uuids=gpus)
            with contextlib.suppress(ValueError):
                launch.stop_grace_s = int(labels.get(LABEL_GRACE, "30"))
            launch.replaceable = labels.get(LABEL_REPLACEABLE) == "true"
            launch.cpuset = labels.get(LABEL_CPUSET) or None
            directory = self._dir(launch_id)
            with contextlib.suppress(OSError):
                launch.warned_for = (directory / "warned").read_text().strip() or None
            with contextlib.suppress(OSError):
                launch.fenced = (directory / "fenced").read_text().strip() or None
            with contextlib.suppress(OSError):
                launch.image_digest = (directory / "image_digest").read_text().strip() or None
            if launch.image_digest is None:
                launch.image_digest = self._digest_of(container)
            deadline = self._read_json(directory / "stopping.json")
            if deadline:
                launch.stop_deadline = datetime.fromisoformat(deadline["deadline"])
                launch.killed = bool(deadline.get("killed"))
            final = self._read_json(directory / "final.json")
            if final:
                launch.final = schema.ContainerReport.model_validate(final)
                if launch.final.state == "failed":
                    launch.final_failure = launch.final.error
            self._launches[launch_id] = launch
        launch.container = container
        return launch

    def _digest_of(self, container: Container) -> str | None:
        """The repository digest of an adopted container's image, from the engine."""
        with contextlib.suppress(DockerException, RequestException, KeyError, TypeError):
            config = container.attrs.get("Config") or {}
            image = self.client.images.get(str(container.attrs["Image"]))
            return repo_digest(image.attrs, str(config.get("Image") or ""))
        return None

    def _refresh(self) -> None:
        seen: set[str] = set()
        for container in self._ours():
            launch = self._track_container(container)
            seen.add(launch.launch_id)
        for launch in self._launches.values():
            if launch.container is not None and launch.launch_id not in seen and launch.launch_id not in self._ops:
                # Gone without us removing it (an operator's `docker rm`): report it missing, never relaunch.
                launch.container = None
                if not launch.removed and launch.final is None:
                    launch.final_failure = launch.final_failure or "the container disappeared from the engine"
                    launch.missing = True

    # -- launching -----------------------------------------------------------------------------------------

    def _new_launch(self, spec: schema.DesiredContainer) -> Launch:
        return Launch(
            launch_id=spec.launch_id,
            reservation=spec.reservation,
            gpu_uuids=list(spec.gpu_uuids),
            stop_grace_s=spec.stop_grace_s,
        )

    def _launch(self, launch: Launch, spec: schema.DesiredContainer, now: datetime) -> Future[_Outcome] | None:
        """Create the container in a worker (and start it too when the window is open); None when not yet."""
        if now < spec.window_start - self.prepare_ahead:
            return None  # reported as pending: created nearer its window, run only inside it
        if now >= spec.window_end:
            self._fail(launch, "the window ended before the container could start")
            return None
        holder = self._gpu_holder(spec)
        if holder is not None:
            gpu, other = holder
            launch.blocked = f"GPU {gpu} is already bound to launch {other}"
            return None
        launch.blocked = None
        # Here, in the reconciling thread: two launches created at once never pick the same CPUs.
        launch.cpuset = self._pick_cpuset(spec)
        mount_dir = self._dir(spec.launch_id) / "mount"
        mount_dir.mkdir(parents=True, exist_ok=True)
        # The job may run as any user; it must be able to read the warning file.
        os.chmod(mount_dir, 0o755)  # noqa: S103 - world-readable on purpose, nothing secret lives here
        if spec.replaceable:
            watchdog.prepare_mount_dir(mount_dir, busybox=self.busybox is not None)
        start = now >= spec.window_start
        launch.prepared = not start
        return self._submit(launch, self._op_create, spec, mount_dir, start)

    def _submit(
        self, launch: Launch, fn: Callable[..., _Outcome], *args: Any, pool: ThreadPoolExecutor | None = None
    ) -> Future[_Outcome]:
        op = (pool or self._pool).submit(fn, *args)
        self._ops[launch.launch_id] = op
        if self._waker is not None:
            waker = self._waker
            op.add_done_callback(lambda _: waker())
        return op

    def _collect_ops(self) -> None:
        """Apply what finished creates and starts came to (in this, the reconciling, thread)."""
        for launch_id, op in list(self._ops.items()):
            if not op.done():
                continue
            del self._ops[launch_id]
            launch = self._launches.get(launch_id)
            if launch is None or op.cancelled():
                continue
            try:
                outcome = op.result()
            except (DockerException, RequestException) as exc:
                # The engine did not answer: nothing is known to have happened; the next reconcile tries again.
                log.warning("launch %s: the engine did not answer (%s); trying again", launch_id, exc)
                continue
            if outcome.digest is not None and outcome.digest != launch.image_digest:
                launch.image_digest = outcome.digest
                (self._dir(launch_id) / "image_digest").write_text(outcome.digest + "\n")
            if outcome.pulled:
                launch.pulled = True
            if outcome.ulimit_refused is not None:
                self._ulimit_refused(outcome.ulimit_refused)
                launch.ulimit_retries += 1
                if launch.ulimit_retries <= MAX_ULIMIT_RETRIES:
                    launch.container = None
                    continue  # the next reconcile creates it again, without what the engine cannot grant
            if outcome.failure is not None:
                self._fail(launch, outcome.failure)
            elif outcome.needs_pull:
                if launch.pulled or launch.desired is None:
                    # Pulled, and gone again before its create (an operator's `docker rmi`): no second pull.
                    self._fail(launch, f"image not found: {launch.desired.image if launch.desired else ''}")
                else:
                    self._submit(launch, self._op_pull, launch.desired, pool=self._pull_pool)
            if outcome.gone:
                launch.container = None
                launch.removed = launch.removed or outcome.failure is not None
            elif outcome.container is not None:
                self._track_container(outcome.container)
            if outcome.started:
                launch.prepared = False
                log.info("launched %s on %s", launch_id, ",".join(launch.gpu_uuids))

    def _op_pull(self, spec: schema.DesiredContainer) -> _Outcome:
        """Pull the launch's image (in the pull pool), with its credentials; progress goes to the launch's report."""
        launch_id = spec.launch_id

        def progress(snapshot: schema.PullProgress) -> None:
            self._pull_progress[launch_id] = snapshot

        progress(schema.PullProgress())
        try:
            pulled = self.images.ensure(
                spec.image, spec.registry_auth, reservations=[spec.reservation], on_progress=progress
            )
        except PullFailed as exc:
            return _Outcome(pulled=True, failure=str(exc))
        finally:
            self._pull_progress.pop(launch_id, None)
        log.info("pulled %s for %s (%s)", spec.image, launch_id, pulled.digest or "no repository digest")
        return _Outcome(pulled=True, digest=pulled.digest)

    def _op_create(self, spec: schema.DesiredContainer, mount_dir: Path, start: bool) -> _Outcome:
        image = self.images.local(spec.image)
        if image is None:
            return _Outcome(needs_pull=True)
        self.images.cache.touch(spec.image)
        try:
            # Here, in a worker: measuring a volume against its limit may walk network storage for a while.
            args = self._create_args(spec, mount_dir, image.local)
        except (LaunchRefused, DeviceError) as exc:
            return _Outcome(failure=str(exc))
        except ImageNotFound:  # a replaceable launch reads the image's entrypoint first
            return _Outcome(needs_pull=True)
        try:
            container = self.client.containers.create(**args)
        except ImageNotFound:
            return _Outcome(needs_pull=True)
        except APIError as exc:
            if exc.status_code != 409:
                return _Outcome(failure=f"the engine refused to create the container: {exc.explanation or exc}")
            # Another runtime (a restarted agent, a racing heartbeat) created it first: adopt, never duplicate.
            container = self._get_conflicting(container_name(spec.launch_id))
            if container is None:
                return _Outcome()  # removed in between; the next reconcile looks again
            if (container.labels or {}).get(LABEL_LAUNCH) != spec.launch_id:
                return _Outcome(failure=f"a container named {container.name} exists and is not this launch's")
            return _Outcome(container=container, digest=image.digest)
        if start:
            outcome = self._op_start(container)
            outcome.digest = image.digest
            return outcome
        return _Outcome(container=container, digest=image.digest)

    def _op_start(self, container: Container) -> _Outcome:
        try:
            container.start()
        except NotFound:
            return _Outcome(gone=True)
        except APIError as exc:
            # 304: already started by a racing runtime, which is the state we want.
            if exc.status_code != 304:
                # A container that never started holds nothing worth keeping, and left in "created" it
                # would look like a live holder of its GPUs.
                with contextlib.suppress(NotFound, APIError):
                    container.remove(force=True)
                failure = f"the container did not start: {exc.explanation or exc}"
                # Also when another launch's start found it out first: this one was created before that was known.
                refused = resources.refused_ulimit(str(exc.explanation or exc))
                return _Outcome(gone=True, failure=failure, ulimit_refused=refused)
        with contextlib.suppress(NotFound):
            container.reload()
        return _Outcome(container=container, started=True)

    def _get_conflicting(self, name: str) -> Container | None:
        # The engine reserves a name before the container can be inspected (creating its file system takes
        # seconds on a loaded host), so a racing creator's container answers 404 for a while after our 409.
        # The wait is bounded and only ever paid in that race.
        deadline = time.monotonic() + CONFLICT_WAIT_S
        while True:
            try:
                return self.client.containers.get(name)
            except NotFound:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.1)

    def _create_args(self, spec: schema.DesiredContainer, mount_dir: Path, image: str | None = None) -> dict[str, Any]:
        args = self._plain_create_args(spec, mount_dir)
        if image is not None:
            args["image"] = image  # the reference, or a mirror's name of it when only that names it here
        if not spec.replaceable:
            return args
        # Replaceable work runs under the lease watchdog, around what the image itself would run.
        config = self.client.images.get(args["image"]).attrs.get("Config") or {}
        return watchdog.wrap(args, spec, image_config=config, lease=self.lease_dir, busybox=self.busybox)

    def _ulimit_refused(self, name: str) -> None:
        """The engine cannot raise ``name`` (a dockerd without the privilege to, e.g. in a container of its own):
        remember it, here and on disk, so launches run with the engine's own limit instead of not at all."""
        if name in self._ulimits_refused:
            return
        self._ulimits_refused.add(name)
        path = self.state_dir / ULIMITS_REFUSED_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self._ulimits_refused)))
        tmp.replace(path)
        log.warning(
            "the Docker engine cannot raise the %s ulimit (it lacks the privilege); containers run with its own "
            "limit. Give dockerd the limit (e.g. LimitMEMLOCK=infinity in its systemd unit) and restart the agent.",
            name,
        )

    def _plain_create_args(self, spec: schema.DesiredContainer, mount_dir: Path) -> dict[str, Any]:
        if spec.resources is not None and self._ulimits_refused:
            granted = [u for u in spec.resources.ulimits if u.name not in self._ulimits_refused]
            spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"ulimits": granted})})
        secrets.check(spec)
        launch = self._launches.get(spec.launch_id)
        share = launch.cpuset if launch is not None and self._has_cpu_share(spec) else None
        return create_args(
            spec,
            node=self.node,
            mount_dir=mount_dir,
            network_mode=network_for(spec, self.client, self.network_mode),
            default_memory_limit_mib=self.default_memory_limit_mib,
            default_pids_limit=self.default_pids_limit,
            cpuset=share or self.cpuset_for(spec.gpu_uuids),
            nvidia_runtime=self.nvidia_runtime,
            mounts=mounts_for(spec, self.volumes),
            amd=self.amd_devices_for(spec.gpu_uuids),
            secret_files=secrets.prepare_files(mount_dir.parent, spec),
        )

    def amd_devices_for(self, gpu_uuids: Iterable[str]) -> AmdDevices | None:
        """The device nodes of the launch's GPUs when they are AMD's; None for NVIDIA's (or unknown) GPUs.
        Raises ``DeviceError`` when an AMD GPU's render node cannot be found, or the launch mixes vendors."""
        if self._gpu_info is None:
            return None
        infos = [self._gpu_info(uuid) for uuid in gpu_uuids]
        vendors = {info.vendor if info is not None else "nvidia" for info in infos}
        if vendors == {"nvidia"}:
            return None
        if len(vendors) > 1:
            raise DeviceError("a launch cannot mix NVIDIA and AMD GPUs")
        return amd_devices([info for info in infos if info is not None], sysfs_root=self.sysfs_root)

    def cpuset_for(self, gpu_uuids: Iterable[str]) -> str | None:
        """The CPUs of the NUMA node(s) the GPUs sit on; None when any of them is unknown (no pinning then)."""
        nodes: list[int] = []
        for uuid in gpu_uuids:
            numa = self._numa_of(uuid)
            if numa is None or numa < 0 or str(numa) not in self.numa_cpus:
                return None
            if numa not in nodes:
                nodes.append(numa)
        if not nodes:
            return None
        return ",".join(self.numa_cpus[str(n)] for n in sorted(nodes))

    @staticmethod
    def _has_cpu_share(spec: schema.DesiredContainer) -> bool:
        return spec.resources is not None and spec.resources.cpus is not None

    def _pick_cpuset(self, spec: schema.DesiredContainer) -> str | None:
        """The CPUs of a launch with a CPU share (``resources.cpus``): on its GPUs' NUMA nodes, apart from the
        CPUs of this runtime's other live containers where there are enough (``resources.pick_cpus``)."""
        if spec.resources is None or spec.resources.cpus is None:
            return None
        all_cpus = self._host_cpus()
        local = self.cpuset_for(spec.gpu_uuids)
        taken = resources.taken_cpus(
            other.cpuset
            for other in self._launches.values()
            if other.launch_id != spec.launch_id and (other.status in LIVE_STATES or other.launch_id in self._ops)
        )
        picked = resources.pick_cpus(
            spec.resources.cpus,
            local=None if local is None else resources.parse_cpulist(local),
            all_cpus=all_cpus,
            taken=taken,
        )
        cpuset = resources.format_cpulist(picked)
        shared = sorted(cpu for cpu in picked if taken.get(cpu))
        log.info(
            "launch %s: %d CPUs (%s) %s%s",
            spec.launch_id,
            len(picked),
            cpuset,
            "on its GPUs' NUMA nodes" if local is not None else "(its GPUs' NUMA nodes are unknown)",
            f", sharing {resources.format_cpulist(shared)} with other containers" if shared else "",
        )
        return cpuset or None

    def _host_cpus(self) -> list[int]:
        """Every CPU the containers may be pinned to: those of the NUMA nodes when known, else the engine's."""
        if self._all_cpus is None:
            cpus: set[int] = set()
            for text in self.numa_cpus.values():
                with contextlib.suppress(ValueError):
                    cpus.update(resources.parse_cpulist(text))
            if not cpus:
                count = 0
                with contextlib.suppress(DockerException, RequestException, TypeError, ValueError):
                    count = int(self.client.info().get("NCPU") or 0)
                cpus = set(range(count or os.cpu_count() or 1))
            self._all_cpus = sorted(cpus)
        return self._all_cpus

    def _numa_of(self, uuid: str) -> int | None:
        if self._gpu_numa is None:
            return None
        if callable(self._gpu_numa):
            return self._gpu_numa(uuid)
        return self._gpu_numa.get(uuid)

    def _gpu_holder(self, spec: schema.DesiredContainer) -> tuple[str, str] | None:
        wanted = set(spec.gpu_uuids)
        for other in self._launches.values():
            if other.launch_id == spec.launch_id:
                continue
            if other.status not in LIVE_STATES and other.launch_id not in self._ops:
                continue
            for gpu in spec.gpu_uuids:
                if gpu in wanted and gpu in other.gpu_uuids:
                    return gpu, other.launch_id
        return None

    def _fail(self, launch: Launch, reason: str) -> None:
        if launch.desired is not None:
            reason = secrets.redact(reason, launch.desired.secrets)  # the engine's words, never a value
        log.warning("launch %s failed: %s", launch.launch_id, reason)
        launch.final_failure = reason[:ERROR_CHARS]

    # -- warning and stop ----------------------------------------------------------------------------------

    @staticmethod
    def _warn_at(spec: schema.DesiredContainer) -> datetime:
        if spec.warn_before_s <= 0:
            return spec.window_end  # no warning: the stop comes first
        return spec.window_end - timedelta(seconds=spec.warn_before_s)

    def _warn(self, launch: Launch, now: datetime) -> None:
        spec = launch.desired
        assert spec is not None
        self._notify(
            launch,
            {
                "window_end": iso(spec.window_end),
                "stop_at": iso(spec.window_end),
                "kill_at": iso(spec.window_end + timedelta(seconds=spec.stop_grace_s)),
                **({"reason": spec.notice_reason} if spec.notice_reason else {}),
            },
        )

    def _notify(self, launch: Launch, payload: dict[str, str]) -> None:
        """The notice before a stop: the warning file, then SIGUSR1."""
        mount_dir = self._dir(launch.launch_id) / "mount"
        mount_dir.mkdir(parents=True, exist_ok=True)
        tmp = mount_dir / ".warning.tmp"
        tmp.write_text(json.dumps(payload) + "\n")
        os.chmod(tmp, 0o644)
        # A rename, so the job never reads half a file.
        tmp.replace(mount_dir / "warning")
        # The marker goes first: a crash between it and the signal loses one warning, never sends two.
        launch.warned_for = payload["window_end"]
        (self._dir(launch.launch_id) / "warned").write_text(launch.warned_for + "\n")
        self._signal(launch, "SIGUSR1")

    def _fence_launch(self, launch: Launch, now: datetime, reason: str) -> None:
        # The mark goes first, like the warning's: a crash after it still reports the stop as the fence's.
        launch.fenced = reason[:ERROR_CHARS]
        (self._dir(launch.launch_id) / "fenced").write_text(launch.fenced + "\n")
        end = launch.desired.window_end if launch.desired is not None else now
        self._notify(
            launch,
            {
                "window_end": iso(end),
                "stop_at": iso(now),
                "kill_at": iso(now + timedelta(seconds=launch.stop_grace_s)),
                "reason": launch.fenced,
            },
        )
        log.warning("%s: stopping %s", reason, launch.launch_id)
        self._begin_stop(launch, now)

    def _begin_stop(self, launch: Launch, now: datetime) -> None:
        if launch.stop_deadline is not None:
            return
        if launch.status == "created":
            # Never started: nothing to warn or wait for.
            self._remove(launch)
            if launch.final_failure is None:
                self._fail(launch, "stopped before it started")
            return
        launch.stop_deadline = now + timedelta(seconds=launch.stop_grace_s)
        self._write_json(launch, "stopping.json", {"deadline": launch.stop_deadline.isoformat(), "killed": False})
        if launch.stop_grace_s <= 0:
            self._kill(launch)
        else:
            self._signal(launch, "SIGTERM")

    def _kill(self, launch: Launch) -> None:
        if launch.killed:
            return
        launch.killed = True
        assert launch.stop_deadline is not None
        self._write_json(launch, "stopping.json", {"deadline": launch.stop_deadline.isoformat(), "killed": True})
        self._signal(launch, "SIGKILL")

    def _signal(self, launch: Launch, signal: str) -> None:
        if launch.container is None:
            return
        try:
            launch.container.kill(signal=signal)
        except NotFound:
            launch.container = None
        except APIError as exc:
            # 409: it exited between our look and the signal, which is what a stop wants anyway.
            if exc.status_code != 409:
                raise
        log.info("sent %s to %s", signal, launch.launch_id)

    # -- reporting and clean-up ----------------------------------------------------------------------------

    def _collect_garbage(self) -> None:
        """Remove finished containers once reported, and forget launches the desired state no longer holds."""
        for launch in list(self._launches.values()):
            if launch.launch_id in self._ops:
                continue
            never_ran = launch.container is None and launch.final is None and launch.final_failure is None
            if launch.desired is None and never_ran:
                # Dropped from the desired state before it ever ran (cancelled while pending or blocked).
                del self._launches[launch.launch_id]
                shutil.rmtree(self._dir(launch.launch_id), ignore_errors=True)
                continue
            terminal = (
                launch.final is not None or launch.final_failure is not None or launch.status in ("exited", "dead")
            )
            if not terminal or launch.terminal_reports < self.remove_after_reports:
                continue
            if launch.container is not None:
                self._remove(launch)
            if launch.desired is None:
                del self._launches[launch.launch_id]
                shutil.rmtree(self._dir(launch.launch_id), ignore_errors=True)

    def _remove(self, launch: Launch) -> None:
        if launch.container is None:
            return
        try:
            launch.container.remove(force=True)
        except NotFound:
            pass
        except APIError as exc:
            # 409: removal already in progress (a racing runtime); the next refresh will not see it.
            if exc.status_code != 409:
                raise
        launch.container = None
        launch.removed = True

    # -- launch directories --------------------------------------------------------------------------------

    def _dir(self, launch_id: str) -> Path:
        path = self.launch_root / safe_id(launch_id)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _write_json(self, launch: Launch, name: str, payload: dict[str, Any]) -> None:
        path = self._dir(launch.launch_id) / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload))
        tmp.replace(path)

    @staticmethod
    def _read_json(path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
