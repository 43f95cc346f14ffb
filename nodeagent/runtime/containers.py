"""What a container of ours looks like to Docker: its name, labels, create arguments, and the report made
from what Docker says of it. Pure functions of a launch and the engine's answers; ``docker.py`` holds the
runtime that acts on them."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import docker
from docker.errors import DockerException
from docker.models.containers import Container
from docker.types import Mount
from requests.exceptions import RequestException

from nodeagent import schema
from nodeagent.runtime import resources, secrets
from nodeagent.runtime.devices import AmdDevices

LABEL_LAUNCH = "gpucp.launch_id"
LABEL_RESERVATION = "gpucp.reservation"
LABEL_PROJECT = "gpucp.project"
LABEL_GPUS = "gpucp.gpus"
LABEL_WINDOW_END = "gpucp.window_end"
LABEL_GRACE = "gpucp.stop_grace_s"
LABEL_NODE = "gpucp.node"
# Present ("true") on a replaceable launch's container: fenced at the lease, and run under the lease watchdog.
LABEL_REPLACEABLE = "gpucp.replaceable"
# The CPUs a launch with a CPU share (``resources.cpus``) was pinned to: held apart from later launches' picks.
LABEL_CPUSET = "gpucp.cpuset"

MOUNT_POINT = "/run/gpucp"
WARN_FILE = f"{MOUNT_POINT}/warning"
LOG_TAIL_LINES = 50
LOG_TAIL_CHARS = 16000
ERROR_CHARS = 2000
ReportState = Literal["pending", "creating", "running", "stopping", "exited", "failed", "missing"]

_NAME_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_DOCKER_NULL_TIME = "0001-01-01T00:00:00Z"


def container_name(launch_id: str) -> str:
    """The container's name, derived from the launch so a redelivered launch collides instead of duplicating."""
    return f"gpucp-{safe_id(launch_id)}"


def safe_id(launch_id: str) -> str:
    # Docker names and our directory names allow a narrow alphabet; any other id maps to a stable digest.
    if _NAME_SAFE.match(launch_id):
        return launch_id
    return "h" + hashlib.sha256(launch_id.encode()).hexdigest()[:32]


def parse_docker_time(value: str | None) -> datetime | None:
    """Docker writes RFC 3339 with nanoseconds; the zero time means "never"."""
    if not value or value.startswith("0001-01-01"):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", value)
    if not m:
        return None
    base, frac, tz = m.groups()
    text = base + (f".{(frac or '0')[:6].ljust(6, '0')}") + ("+00:00" if tz == "Z" else tz)
    return datetime.fromisoformat(text)


def iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


def detect_nvidia_runtime(client: docker.DockerClient) -> bool:
    """True when the engine lists the NVIDIA container runtime."""
    try:
        runtimes = client.info().get("Runtimes") or {}
    except (DockerException, RequestException):
        return False
    return "nvidia" in runtimes


@dataclass
class Launch:
    """What the runtime knows about one launch, rebuilt from Docker and the launch directory on adoption."""

    launch_id: str
    reservation: str
    gpu_uuids: list[str]
    stop_grace_s: int = 30
    container: Container | None = None
    desired: schema.DesiredContainer | None = None
    # A launch failure that will not heal by retrying (image missing, start refused, window over).
    final_failure: str | None = None
    # A refusal that may heal on a later reconcile (the GPU is still held by the previous container).
    blocked: str | None = None
    # The window end the warning was sent for: an extended window earns a new warning before its new end.
    warned_for: str | None = None
    stop_deadline: datetime | None = None
    killed: bool = False
    # The CPUs picked for its share of the host (``resources.cpus``); None when it has no share.
    cpuset: str | None = None
    terminal_reports: int = 0
    final: schema.ContainerReport | None = None
    removed: bool = False
    missing: bool = False
    # Created ahead of its window and not yet asked to start: reported pending, not creating.
    prepared: bool = False
    # Why the agent's fence stopped it (no reply from the control plane for its lease); reported with it.
    fenced: str | None = None
    # The control plane would place it elsewhere were this node lost (``DesiredContainer.replaceable``): fenced at
    # the lease. From the desired state, or from the container's label once adopted.
    replaceable: bool = False
    # The launch's image was pulled for it (a second "not found" after that fails the launch).
    pulled: bool = False
    # Creates started again because the engine could not raise a ulimit (bounded: never a loop).
    ulimit_retries: int = 0
    # While its image is pulled: how far the pull has come (reported with the launch).
    pull: schema.PullProgress | None = None
    # The repository digest of the image the container was created from, once known.
    image_digest: str | None = None

    @property
    def status(self) -> str | None:
        if self.container is None:
            return None
        return str(self.container.attrs.get("State", {}).get("Status") or self.container.status)


def create_args(
    spec: schema.DesiredContainer,
    *,
    node: str,
    mount_dir: Path,
    network_mode: str,
    default_memory_limit_mib: int | None,
    default_pids_limit: int | None,
    cpuset: str | None,
    nvidia_runtime: bool,
    mounts: Sequence[Mount] = (),
    amd: AmdDevices | None = None,
    secret_files: Path | None = None,
) -> dict[str, Any]:
    """The ``containers.create`` arguments for a launch: its GPUs and nothing else, its labels, its limits and
    resources (``nodeagent.runtime.resources``), its volume and dataset mounts (checked by
    ``nodeagent.runtime.mounts``), its secrets (``nodeagent.runtime.secrets``, checked before) and its
    ``network_mode``. ``amd``: the launch's GPUs are AMD's, and these are their device nodes
    (``nodeagent.runtime.devices``). ``secret_files``: the host directory mounted at ``/run/secrets``."""
    gpus = ",".join(spec.gpu_uuids)
    env = dict(spec.env)
    # Secrets after the tenant's env (a secret wins over a plain variable of the same name); they never name the
    # runtime's own variables (``secrets.check``), which come last anyway.
    env.update(secrets.env_of(spec))
    # Ours last: a tenant's env must not widen the GPUs it sees or fake its window.
    env.update(
        {
            # On an AMD launch, "void": no NVIDIA GPU at all, even where NVIDIA's runtime is the default.
            "NVIDIA_VISIBLE_DEVICES": "void" if amd is not None else gpus,
            "GPUCP_RESERVATION": spec.reservation,
            "GPUCP_WINDOW_END": iso(spec.window_end),
            "GPUCP_WARN_FILE": WARN_FILE,
        }
    )
    memory = spec.memory_limit_mib if spec.memory_limit_mib is not None else default_memory_limit_mib
    share = cpuset if cpuset and spec.resources is not None and spec.resources.cpus else None
    pids = spec.pids_limit if spec.pids_limit is not None else default_pids_limit
    args: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.command) or None,
        "name": container_name(spec.launch_id),
        "detach": True,
        "labels": {
            LABEL_LAUNCH: spec.launch_id,
            LABEL_RESERVATION: spec.reservation,
            LABEL_PROJECT: spec.project,
            LABEL_GPUS: gpus,
            LABEL_WINDOW_END: iso(spec.window_end),
            LABEL_GRACE: str(spec.stop_grace_s),
            LABEL_NODE: node,
            **({LABEL_REPLACEABLE: "true"} if spec.replaceable else {}),
            **({LABEL_CPUSET: share} if share else {}),
        },
        "environment": env,
        "privileged": False,
        "security_opt": ["no-new-privileges"],
        "network_mode": network_mode,
        "volumes": {
            str(mount_dir): {"bind": MOUNT_POINT, "mode": "ro"},
            **({str(secret_files): {"bind": secrets.SECRETS_MOUNT, "mode": "ro"}} if secret_files else {}),
        },
    }
    if mounts:
        args["mounts"] = list(mounts)
    args.update(resources.memory_args(memory))
    args.update(resources.resource_args(spec.resources))
    if pids:
        args["pids_limit"] = pids
    if cpuset:
        args["cpuset_cpus"] = cpuset
    if amd is not None:
        env.update(amd.env)
        args["devices"] = list(amd.devices)
        args["group_add"] = list(amd.group_add)
    elif nvidia_runtime:
        args["device_requests"] = [
            docker.types.DeviceRequest(driver="nvidia", device_ids=list(spec.gpu_uuids), capabilities=[["gpu"]])
        ]
    return args


def launch_report(launch: Launch) -> schema.ContainerReport | None:
    """What the control plane is told of one launch; None for a launch with nothing to say yet."""

    def report(state: ReportState, **fields: Any) -> schema.ContainerReport:
        if launch.fenced is not None:
            fields.update(fenced=True, error=fields.get("error") or launch.fenced)
        if launch.image_digest is not None:
            fields.setdefault("image_digest", launch.image_digest)
        return schema.ContainerReport(
            launch_id=launch.launch_id,
            reservation=launch.reservation,
            gpu_uuids=list(launch.gpu_uuids),
            state=state,
            **fields,
        )

    container = launch.container
    if container is None:
        if launch.blocked is not None:
            # Transient: it starts as soon as the previous container lets go of the GPU.
            return report("pending", error=launch.blocked)
        if launch.missing:
            return report("missing", error=launch.final_failure)
        if launch.final_failure is not None:
            return report("failed", error=launch.final_failure)
        if launch.final is not None:
            return launch.final
        if launch.desired is not None and launch.pull is not None:
            # Its image is being pulled: before the window "pending", at or after it "creating".
            return report("pending" if launch.prepared else "creating", pull=launch.pull)
        if launch.desired is not None:
            return report("pending")
        return None
    state_info = container.attrs.get("State", {})
    status = state_info.get("Status") or container.status
    finished = status in ("exited", "dead")
    state: ReportState
    if launch.final_failure is not None:
        state = "failed"
    elif finished:
        state = "exited"
    elif status == "created":
        state = "pending" if launch.prepared else "creating"
    elif launch.stop_deadline is not None:
        state = "stopping"
    else:
        state = "running"
    oom = finished and launch.final_failure is None and bool(state_info.get("OOMKilled"))
    if oom:
        # The kernel killed a process of the container for its memory limit: say so, with the limit.
        error: str | None = resources.oom_message(container.attrs.get("HostConfig", {}).get("Memory"))
    else:
        error = launch.final_failure or (state_info.get("Error") or None)
    return report(
        state,
        container_id=container.id,
        started_at=parse_docker_time(state_info.get("StartedAt")),
        finished_at=parse_docker_time(state_info.get("FinishedAt")) if finished else None,
        exit_code=state_info.get("ExitCode") if finished else None,
        error=error[:ERROR_CHARS] if error else None,
        log_tail=log_tail(container) if state in ("exited", "failed") else None,
        oom_killed=oom,
    )


def log_tail(container: Container) -> str | None:
    """The last lines the container wrote, bounded in lines and characters."""
    try:
        raw = container.logs(stdout=True, stderr=True, tail=LOG_TAIL_LINES)
    except (DockerException, RequestException):
        return None
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
    if len(text) > LOG_TAIL_CHARS:
        text = text[-LOG_TAIL_CHARS:]
        # Start at a whole line when one fits; a single huge line is kept cut.
        _, newline, rest = text.partition("\n")
        if newline and rest:
            text = rest
    return text
