"""The wire format between node agents and the control plane.

Both sides validate with these models: the agent before it sends, the control plane when it receives.
Field names of telemetry follow DCGM's so operators recognise them. Every model forbids unknown fields so a
typo is an error that names the field instead of silently dropped data.

Versions: the heartbeat is version 2 (``Heartbeat``: samples as columns, one ``GpuSeries`` per GPU); the
control plane still accepts version 1 (``HeartbeatV1``: one object per sample) from older agents, and
``parse_heartbeat`` reads either. Every other message is still version 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticCustomError

T = TypeVar("T")

SCHEMA_VERSION: Final = 1
HEARTBEAT_SCHEMA_VERSION: Final = 2

# Application XIDs: caused by the program running on the GPU, not by the GPU. They never make a GPU unhealthy.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# The DCGM field names a sample may carry. Every one is optional: a field NVML does not support is null.
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"  # percent
FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL"  # MiB
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"  # degrees C
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"  # W
TOTAL_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since driver load
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"  # MHz
ECC_SBE_VOL = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
ECC_DBE_VOL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ECC_DBE_AGG = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
RETIRED_PENDING = "DCGM_FI_DEV_RETIRED_PENDING"
RETIRED_DBE = "DCGM_FI_DEV_RETIRED_DBE"
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
ROW_REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"  # last XID seen
CLOCK_THROTTLE_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"  # bitmask (NVML clocks event reasons)
# DCGM's profiling fields, ratios 0.0 to 1.0 over the last sampling interval: evidence of real work, which a
# busy loop can fake in GPU_UTIL (any kernel resident counts as 100 %) but not here. NVML itself has none of
# them; the NVML backend reads them through NVML's GPM API (Hopper and newer), else they are null.
PROF_SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"  # share of SMs with work
PROF_PIPE_TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"  # share of cycles the tensor pipes were busy
PROF_DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"  # share of peak DRAM bandwidth used
PROFILING_FIELDS = (PROF_SM_ACTIVE, PROF_PIPE_TENSOR_ACTIVE, PROF_DRAM_ACTIVE)

SAMPLE_FIELDS = (
    GPU_UTIL,
    MEM_COPY_UTIL,
    FB_USED,
    FB_TOTAL,
    GPU_TEMP,
    POWER_USAGE,
    TOTAL_ENERGY,
    SM_CLOCK,
    ECC_SBE_VOL,
    ECC_DBE_VOL,
    ECC_DBE_AGG,
    RETIRED_PENDING,
    RETIRED_DBE,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    XID_ERRORS,
    CLOCK_THROTTLE_REASONS,
    *PROFILING_FIELDS,
)

MAX_GPUS = 64
# Counters and sizes stop where the control plane's integer columns do (PostgreSQL's integer and bigint), so a
# value the schema accepts is one the heartbeat can store: beyond them it is a 400 naming the field, never a 500.
MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1
MAX_SAMPLES = 64 * 720  # a few minutes of 1 Hz samples for a full server, buffered while offline
MAX_EVENTS = 1000
MAX_CONTAINERS = 256
MAX_PREPULLS = 256

Uuid = Annotated[str, Field(min_length=4, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
ShortText = Annotated[str, Field(max_length=256)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class ContainerRuntimeFacts(Strict):
    kind: Literal["docker", "none"] = "none"
    version: ShortText | None = None
    # True when the NVIDIA container runtime is installed; otherwise the agent says how GPUs are exposed.
    nvidia_runtime: bool = False
    gpu_mode: Literal["nvidia", "env-only", "none"] = "none"
    detail: ShortText | None = None


class SshGatewayFacts(Strict):
    """The node's SSH gateway (nodeagent.gateway): where tenants connect and the public half of its host key."""

    port: Annotated[int, Field(ge=1, le=65535)]
    # One OpenSSH public key line without a comment: "ssh-ed25519 AAAA...".
    host_key: Annotated[str, Field(min_length=16, max_length=16384, pattern=r"^[a-z0-9@.-]+ [A-Za-z0-9+/=]+$")]
    # The name or address clients reach the gateway at; None: the node's hostname.
    address: Annotated[str, Field(min_length=1, max_length=253)] | None = None


class NodeFacts(Strict):
    hostname: Annotated[str, Field(min_length=1, max_length=253)]
    agent_version: Annotated[str, Field(max_length=32)]
    backend: Literal["nvml", "amdsmi", "simulated"]
    simulated: bool
    driver_version: ShortText | None = None
    cuda_version: ShortText | None = None
    cpu_count: Annotated[int, Field(ge=1, le=4096)] | None = None
    memory_bytes: Annotated[int, Field(ge=0)] | None = None
    # NUMA node -> CPU list as Linux writes it ("0-31,64-95"), for pinning containers next to their GPUs.
    numa_cpus: dict[str, ShortText] = Field(default_factory=dict)
    container_runtime: ContainerRuntimeFacts = Field(default_factory=ContainerRuntimeFacts)
    # Where the agent listens for the control plane's signed commands; None: heartbeats only.
    command_url: Annotated[str, Field(max_length=512, pattern=r"^https?://")] | None = None
    # The agent fences itself (stops its containers after a lease with no reply), so the control plane may give it
    # a lease. Left out of the JSON when false: an agent without fencing sends what it always sent.
    fencing: bool = Field(default=False, exclude_if=lambda value: not value)
    # The SSH gateway, when this agent runs one. Left out of the JSON when None, like ``fencing``.
    ssh: SshGatewayFacts | None = Field(default=None, exclude_if=lambda value: value is None)
    # True when the operator gave this agent a volume root (NODEAGENT_VOLUME_ROOT): it can mount project volumes.
    volumes: bool = Field(default=False, exclude_if=lambda value: not value)
    # The agent keeps work that nothing would replace running while the control plane is silent, up to the
    # ``HeartbeatReply.outage_tolerance_s`` it is told, and fences only ``DesiredContainer.replaceable`` work at the
    # lease. Left out of the JSON when false, like ``fencing``.
    outage_tolerant: bool = Field(default=False, exclude_if=lambda value: not value)
    # The agent pulls images (with registry credentials, ahead of a window: ``HeartbeatReply.prepull``), keeps a
    # node image cache, and applies ``DesiredContainer.secrets`` and ``resources``. Left out of the JSON when false.
    pulls: bool = Field(default=False, exclude_if=lambda value: not value)
    # The node's image cache budget in bytes (None: no budget), for the operator's view.
    image_cache_bytes: Annotated[int, Field(ge=0, le=MAX_INT64)] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )


Vendor = Literal["nvidia", "amd"]
MAX_MIG_DEVICES = 8  # A100 and H100 have at most 7 MIG devices; NVML's own limit is 8 per GPU.
# "1g.10gb", "3g.40gb", "1g.10gb+me", "1c.3g.40gb" (a compute instance sharing a 3-slice GPU instance).
MigProfileName = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[0-9a-z.+]+$")]


class MigDevice(Strict):
    """One MIG device: a compute instance inside a GPU instance, what a container is given by its ``MIG-`` uuid.

    Every field but the uuid may be null: the driver may not answer one of the calls that read it."""

    uuid: Uuid
    gpu_instance_id: Annotated[int, Field(ge=0, le=64)] | None = None
    compute_instance_id: Annotated[int, Field(ge=0, le=64)] | None = None
    # The GPU instance's profile as nvidia-smi names it, without NVML's "MIG " prefix: "3g.40gb".
    profile: MigProfileName | None = None
    # NVML's profile id (nvmlGpuInstanceInfo_t.profileId), which nvidia-smi -lgip lists as "ID".
    profile_id: Annotated[int, Field(ge=0, le=64)] | None = None
    memory_mib: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None
    # Compute slices (the "Ng" of the profile) and memory slices (eighths of the memory) of the GPU instance.
    compute_slices: Annotated[int, Field(ge=0, le=8)] | None = None
    memory_slices: Annotated[int, Field(ge=0, le=8)] | None = None
    # Where the GPU instance starts among the GPU's memory slices (nvmlGpuInstancePlacement_t.start).
    placement_start: Annotated[int, Field(ge=0, le=8)] | None = None


class MigState(Strict):
    """A GPU's MIG mode and devices. ``pending`` differs from ``current`` when a mode change waits for a reset."""

    current: bool
    pending: bool
    devices: list[MigDevice] = Field(default_factory=list, max_length=MAX_MIG_DEVICES)
    # The profiles this GPU offers with how many of each fit on an empty GPU: {"1g.10gb": 7, "7g.80gb": 1}.
    profiles: dict[MigProfileName, Annotated[int, Field(ge=0, le=8)]] = Field(default_factory=dict, max_length=32)


class GpuFacts(Strict):
    uuid: Uuid
    index: Annotated[int, Field(ge=0, le=255)]
    name: Annotated[str, Field(min_length=1, max_length=128)]
    memory_total_mib: Annotated[int, Field(ge=0, le=MAX_INT32)]
    pci_bus_id: ShortText | None = None
    numa_node: Annotated[int, Field(ge=-1, le=1024)] | None = None
    # NVLink peers on NVIDIA, XGMI peers on AMD: GPUs this one talks to without the PCIe switch.
    nvlink_peers: list[Uuid] = Field(default_factory=list, max_length=MAX_GPUS)
    serial: ShortText | None = None
    # Left out of the JSON at their defaults, so an agent's report reads as before to a control plane that
    # predates them (both sides forbid fields they do not know).
    vendor: Vendor = Field(default="nvidia", exclude_if=lambda value: value == "nvidia")
    # None: the GPU cannot do MIG (NVML answers NotSupported) or the backend does not know.
    mig: MigState | None = Field(default=None, exclude_if=lambda value: value is None)


# The widest reading NVML or DCGM gives is an unsigned 64-bit counter. Beyond it a value is no reading, and the
# minute rollups' sums of such values would overflow PostgreSQL's double precision (an error, not infinity).
MAX_READING = 2.0**64
Finite = Annotated[float, Field(allow_inf_nan=False, ge=-MAX_READING, le=MAX_READING)]


class GpuSample(Strict):
    """One reading of one GPU. ``fields`` holds DCGM-named values; an unsupported field is null or absent."""

    uuid: Uuid
    ts: datetime
    # Finite or null: NaN and infinity have no JSON of their own, and folded into a minute they would poison
    # its average and maximum. A reading that is not a number is null.
    fields: dict[str, Finite | None] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ratios_in_range(self) -> GpuSample:
        for name in PROFILING_FIELDS:
            _check_ratio(name, [self.fields.get(name)], series=False)
        return self


def _check_ratio(name: str, values: Iterable[float | None], *, series: bool) -> None:
    """A profiling field is a ratio: 0.0 to 1.0, or null."""
    for i, value in enumerate(values):
        if value is not None and not 0.0 <= value <= 1.0:
            raise PydanticCustomError(
                "ratio_range",
                "{field} is a ratio from 0.0 to 1.0, not {value}",
                {"field": name, "value": value, "index": i, "series": series},
            )


# Seconds since the Unix epoch (UTC), up to the end of year 9999 so that every value is a datetime.
EpochSeconds = Annotated[float, Field(ge=0, le=253402300799.0, allow_inf_nan=False)]


class GpuSeries(Strict):
    """Samples of one GPU as columns: ``ts[i]`` is the time of ``fields[name][i]`` for every field.

    A field the GPU does not support is absent, or null at the readings that lack it. Every list has as many
    values as ``ts``; a series of unequal lengths is refused naming the field.
    """

    uuid: Uuid
    ts: list[EpochSeconds] = Field(max_length=MAX_SAMPLES)
    # Finite or null: NaN and infinity have no JSON of their own, and a reading that is not a number is null.
    fields: dict[str, list[Finite | None]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _columns_match_ts(self) -> GpuSeries:
        n = len(self.ts)
        for name, values in self.fields.items():
            if len(values) != n:
                raise PydanticCustomError(
                    "series_length",
                    "{field} has {count} values but ts has {expected}; every field needs one value per timestamp",
                    {"field": name, "count": len(values), "expected": n},
                )
        for name in PROFILING_FIELDS:
            if name in self.fields:
                _check_ratio(name, self.fields[name], series=True)
        return self


SessionPhase = Literal["open", "close"]


class SessionInfo(Strict):
    """One SSH session of the gateway, opened or closed: who, with which key, from where, and when.

    ``session_id`` is the gateway's own, unique per node; the control plane records each phase once, so a
    resent event is not a second one."""

    session_id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    phase: SessionPhase
    user: ShortText
    fingerprint: ShortText
    source: ShortText
    started_at: datetime
    ended_at: datetime | None = None
    # What the session did: an interactive shell, a command, file transfer, port forwards.
    kinds: list[Literal["shell", "exec", "sftp", "forward"]] = Field(default_factory=list, max_length=4)
    # Why it closed ("client disconnected", "the window ended", ...); empty while open.
    reason: Annotated[str, Field(max_length=500)] = ""


# applied: the GPU has the layout. refused: the GPU or NVML would not (the layout is unchanged or empty).
# reset_required: the MIG mode change is pending until the GPU is reset (NVML's pending mode).
MigOutcome = Literal["applied", "refused", "reset_required"]


class AgentEvent(Strict):
    # "mig": the outcome of a MIG reconfiguration the control plane asked for (``HeartbeatReply.mig``).
    kind: Literal["xid", "gpu_lost", "container", "agent", "error", "session", "mig"]
    ts: datetime
    uuid: Uuid | None = None
    xid: Annotated[int, Field(ge=0, le=100000)] | None = None
    message: Annotated[str, Field(max_length=2000)] = ""
    reservation: Annotated[str, Field(max_length=64)] | None = None
    # With kind "session": the SSH session. Left out of the JSON when None.
    session: SessionInfo | None = Field(default=None, exclude_if=lambda value: value is None)
    # With kind "mig": the ``DesiredMig.generation`` it answers and how it ended; ``message`` gives the reason
    # (NVML's, on a refusal). Left out of the JSON when None.
    generation: Annotated[int, Field(ge=0)] | None = Field(default=None, exclude_if=lambda value: value is None)
    outcome: MigOutcome | None = Field(default=None, exclude_if=lambda value: value is None)


class ContainerReport(Strict):
    """A container the agent runs or ran for an allocation, as Docker saw it."""

    launch_id: Annotated[str, Field(min_length=1, max_length=64)]
    reservation: Annotated[str, Field(min_length=1, max_length=64)]
    container_id: ShortText | None = None
    state: Literal["pending", "creating", "running", "stopping", "exited", "failed", "missing"]
    gpu_uuids: list[Uuid] = Field(default_factory=list, max_length=MAX_GPUS)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: Annotated[int, Field(ge=-MAX_INT32 - 1, le=MAX_INT32)] | None = None
    error: Annotated[str, Field(max_length=2000)] | None = None
    log_tail: Annotated[str, Field(max_length=16000)] | None = None
    # Stopped by the agent's fence (no reply from the control plane for its lease), not by the control plane;
    # ``error`` says why. Left out of the JSON when false.
    fenced: bool = Field(default=False, exclude_if=lambda value: not value)
    # The repository digest of the image the container was created from (``sha256:...``): what ran.
    image_digest: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )
    # The engine killed the container for going over its memory limit; ``error`` then begins "out of memory".
    oom_killed: bool = Field(default=False, exclude_if=lambda value: not value)
    # While the image is pulled for this launch (it was not on the node at its window): how far it has come.
    pull: PullProgress | None = Field(default=None, exclude_if=lambda value: value is None)


VolumeName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9_-]*$")]
ProjectSlug = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]


class VolumeUsage(Strict):
    """How much a project volume holds, as the agent measured it under its volume root."""

    project: ProjectSlug
    name: VolumeName
    used_bytes: Annotated[int, Field(ge=0, le=MAX_INT64)]
    measured_at: datetime


MAX_VOLUMES = 32


class HeartbeatV1(Strict):
    """Version 1 of the heartbeat, one object per sample: what agents before version 2 send."""

    schema_version: Literal[1] = 1
    seq: Annotated[int, Field(ge=0, le=MAX_INT64)]
    sent_at: datetime
    node: NodeFacts
    gpus: list[GpuFacts] = Field(max_length=MAX_GPUS)
    samples: list[GpuSample] = Field(default_factory=list, max_length=MAX_SAMPLES)
    events: list[AgentEvent] = Field(default_factory=list, max_length=MAX_EVENTS)
    containers: list[ContainerReport] = Field(default_factory=list, max_length=MAX_CONTAINERS)


class Heartbeat(Strict):
    """The agent's report (version 2): samples as one ``GpuSeries`` per GPU, times in epoch seconds.

    A JSON object per sample made the control plane parse, validate and fold every sample's field names and
    ISO timestamp; columns carry the same readings as a few lists of numbers per GPU.
    """

    schema_version: Literal[2] = HEARTBEAT_SCHEMA_VERSION
    seq: Annotated[int, Field(ge=0, le=MAX_INT64)]
    sent_at: datetime
    node: NodeFacts
    gpus: list[GpuFacts] = Field(max_length=MAX_GPUS)
    samples: list[GpuSeries] = Field(default_factory=list, max_length=MAX_SAMPLES)
    events: list[AgentEvent] = Field(default_factory=list, max_length=MAX_EVENTS)
    containers: list[ContainerReport] = Field(default_factory=list, max_length=MAX_CONTAINERS)
    # Volumes measured since the last answered heartbeat. Left out of the JSON when empty.
    volumes: list[VolumeUsage] = Field(
        default_factory=list, max_length=MAX_CONTAINERS * MAX_VOLUMES, exclude_if=lambda value: not value
    )
    # Images pulled or pulling since the last answered heartbeat (docs/images.md). Left out of the JSON when empty.
    images: list[ImageReport] = Field(default_factory=list, max_length=MAX_PREPULLS, exclude_if=lambda value: not value)

    @model_validator(mode="after")
    def _at_most_max_samples(self) -> Heartbeat:
        total = sum(len(series.ts) for series in self.samples)
        if total > MAX_SAMPLES:
            raise PydanticCustomError(
                "too_many_samples",
                "a heartbeat carries at most {limit} samples, this one {count}",
                {"field": "samples", "limit": MAX_SAMPLES, "count": total},
            )
        return self


def samples_as_columns(
    samples: Iterable[GpuSample], when: Callable[[datetime], T]
) -> dict[str, tuple[list[T], dict[str, list[float | None]]]]:
    """Per GPU, in the order the GPUs first appear: its sample times (each as ``when`` gives it) and one list per
    field, in the samples' order. A field missing from some samples is null at those readings."""
    grouped: dict[str, list[GpuSample]] = {}
    for sample in samples:
        grouped.setdefault(sample.uuid, []).append(sample)
    out = {}
    for uuid, group in grouped.items():
        names: dict[str, None] = {}
        for sample in group:
            names.update(dict.fromkeys(sample.fields))
        fields = {name: [sample.fields.get(name) for sample in group] for name in names}
        out[uuid] = ([when(sample.ts) for sample in group], fields)
    return out


def series_from_samples(samples: Iterable[GpuSample]) -> list[GpuSeries]:
    """One series per GPU, as the buffer holds the samples (``samples_as_columns``), times in epoch seconds."""
    # Built from validated samples: constructing skips validating every number a second time.
    return [
        GpuSeries.model_construct(uuid=uuid, ts=ts, fields=fields)
        for uuid, (ts, fields) in samples_as_columns(samples, _epoch).items()
    ]


def _epoch(ts: datetime) -> float:
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).timestamp()


AnyHeartbeat = Annotated[HeartbeatV1 | Heartbeat, Field(discriminator="schema_version")]
_ANY_HEARTBEAT: TypeAdapter[HeartbeatV1 | Heartbeat] = TypeAdapter(AnyHeartbeat)


def parse_heartbeat(raw: bytes | str) -> HeartbeatV1 | Heartbeat:
    """Validate a heartbeat of either version straight from its JSON; a body without ``schema_version`` is
    version 1, as it was before version 2 existed. Raises ``pydantic.ValidationError``; ``error_fields``
    turns it into dotted field paths."""
    try:
        return _ANY_HEARTBEAT.validate_json(raw)
    except ValidationError as exc:
        if any(err["type"] == "union_tag_not_found" for err in exc.errors()):
            return HeartbeatV1.model_validate_json(raw)
        raise


def error_fields(exc: ValidationError) -> dict[str, list[str]]:
    """Dotted field paths (``samples.2.fields.DCGM_FI_DEV_GPU_TEMP.7``) and their messages."""
    fields: dict[str, list[str]] = {}
    for err in exc.errors(include_url=False, include_input=False):
        loc: list[Any] = list(err["loc"])
        kind = err["type"]
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            loc = ["schema_version"]
        elif loc and loc[0] in (1, 2) and kind != "json_invalid":
            loc = loc[1:]  # the version tag of the union, not a field
        ctx = err.get("ctx") or {}
        if kind == "series_length":
            loc += ["fields", ctx["field"]]
        elif kind == "ratio_range":
            loc += ["fields", ctx["field"], *([ctx["index"]] if ctx.get("series") else [])]
        elif kind == "too_many_samples":
            loc.append("samples")
        path = ".".join(str(part) for part in loc) or "body"
        fields.setdefault(path, []).append(err["msg"])
    return fields


MAX_SSH_KEYS = 2000


class AuthorizedKey(Strict):
    """A key the gateway accepts for one reservation: a user of its project (owner or member) and their key."""

    user: ShortText
    # "ssh-ed25519 AAAA..." as the control plane stored it (type and base64 blob, no comment).
    public_key: Annotated[str, Field(min_length=16, max_length=16384)]
    fingerprint: ShortText


# Container paths a mount may never cover or replace (docs/access.md, "Mount paths"), shared by the control
# plane's booking check and the agent's own.
FORBIDDEN_MOUNT_PATHS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
                         "/run", "/sbin", "/sys", "/usr", "/var", "/run/gpucp")  # fmt: skip
# Paths under which nothing may be mounted either (the kernel's and the agent's own).
FORBIDDEN_MOUNT_TREES = ("/dev", "/proc", "/sys", "/run/gpucp")


def mount_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a mount point in a container, or None when it can."""
    if not isinstance(path, str) or not path.startswith("/"):
        return "Must be an absolute path, such as /workspace."
    if len(path) > 4096 or "\x00" in path:
        return "Must be at most 4096 characters, without NUL."
    parts = path.split("/")[1:]
    if path != "/" and (path.endswith("/") or any(part in ("", ".", "..") for part in parts)):
        return "Must be a normalised path: no '.', '..', '//' or trailing '/'."
    if path in FORBIDDEN_MOUNT_PATHS:
        return f"{path} is the container's own and cannot be a mount point."
    for tree in FORBIDDEN_MOUNT_TREES:
        if path.startswith(tree + "/"):
            return f"Nothing can be mounted under {tree}."
    return None


class VolumeMount(Strict):
    """A project volume (``<root>/<project>/<name>``) or an operator's dataset (read-only), and where it goes."""

    kind: Literal["volume", "dataset"]
    name: VolumeName
    # The volume's project; None for a dataset.
    project: ProjectSlug | None = None
    path: Annotated[str, Field(min_length=1, max_length=4096)]
    read_only: bool = False
    # A volume's size limit: over it, the agent refuses to launch. None for a dataset.
    limit_bytes: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _valid_mount(self) -> VolumeMount:
        problem = mount_path_problem(self.path)
        if problem is not None:
            raise PydanticCustomError("mount_path", "path: {problem}", {"problem": problem})
        if (self.kind == "volume") != (self.project is not None):
            raise PydanticCustomError("mount_project", "a volume names its project, a dataset does not", {})
        return self


MAX_SECRETS = 64
SecretName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
# The env variable names a secret may take: what a POSIX shell can name, and never one of the runtime's own.
EnvName = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
# Where secrets meant as files appear in the container: one file per secret, named after it.
SECRETS_DIR = "/run/secrets"
# The runtime's own variables: the GPUs the container sees and what the agent tells the job. A secret never sets
# them: the control plane refuses such a booking, the agent such a launch (the tenant's plain env may try; the
# runtime's values are set after it and win).
RUNTIME_ENV_NAMES = frozenset({"NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"})
RUNTIME_ENV_PREFIX = "GPUCP_"


def runtime_env(name: str) -> bool:
    """Whether ``name`` is one of the runtime's own variables."""
    return name in RUNTIME_ENV_NAMES or name.startswith(RUNTIME_ENV_PREFIX)


class RegistryAuth(Strict):
    """Credentials for the one registry an image is pulled from (docs/images.md). Sent only inside the launch or
    pre-pull that needs them; the agent hands them to the engine's pull and writes them nowhere but its held
    desired state (mode 0600), never to a log."""

    # host[:port] as ``nodeagent.imageref`` reads it from the image reference (docker.io for Docker Hub).
    registry: Annotated[str, Field(min_length=1, max_length=253)]
    username: Annotated[str, Field(min_length=1, max_length=256)]
    password: Annotated[str, Field(min_length=1, max_length=8192)] = Field(repr=False)


class SecretValue(Strict):
    """One project secret a launch asked for: as the variable ``env``, as the file ``/run/secrets/<name>``, or
    both. The value never appears in a report, an event or a log line of either side."""

    name: SecretName
    value: Annotated[str, Field(max_length=65536)] = Field(repr=False)
    env: EnvName | None = None
    file: bool = False

    @model_validator(mode="after")
    def _goes_somewhere(self) -> SecretValue:
        if self.env is None and not self.file:
            raise PydanticCustomError("secret_target", "a secret goes to an env variable, a file, or both", {})
        return self


class Ulimit(Strict):
    """One resource limit, as ``docker run --ulimit name=soft:hard`` sets it; -1 is unlimited."""

    name: Literal["memlock", "stack", "nofile", "nproc", "core"]
    soft: Annotated[int, Field(ge=-1, le=MAX_INT64)]
    hard: Annotated[int, Field(ge=-1, le=MAX_INT64)]


class ContainerResources(Strict):
    """What the container gets of the server besides its GPUs, by the operator's policy (docs/runtime.md,
    "Resources"): computed by the control plane, applied by the agent."""

    # Host CPUs (whole cores) the container is pinned to; the agent picks them on its GPUs' NUMA nodes, apart from
    # the CPUs of its other containers where it can. None: pinned to its GPUs' NUMA nodes whole when they are known,
    # else not pinned (as before resources existed).
    cpus: Annotated[int, Field(ge=1, le=4096)] | None = None
    # The size of /dev/shm; None leaves the engine's default (64 MiB, too small for PyTorch's DataLoader).
    shm_size_mib: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    ulimits: list[Ulimit] = Field(default_factory=list, max_length=8)


class PullProgress(Strict):
    """How far a pull has come: layers and bytes as the engine reports them, and seconds since it began."""

    layers_done: Annotated[int, Field(ge=0, le=10000)] = 0
    layers_total: Annotated[int, Field(ge=0, le=10000)] = 0
    bytes_done: Annotated[int, Field(ge=0, le=MAX_INT64)] = 0
    bytes_total: Annotated[int, Field(ge=0, le=MAX_INT64)] = 0
    seconds: Annotated[float, Field(ge=0, le=1e9)] = 0.0


class PrePull(Strict):
    """An image an upcoming reservation on this node needs: the agent pulls it ahead of ``needed_at`` and keeps
    it out of its cache's eviction until then. Sent only to an agent that says it pulls (``NodeFacts.pulls``)."""

    image: Annotated[str, Field(min_length=1, max_length=512)]
    registry_auth: RegistryAuth | None = Field(default=None, exclude_if=lambda value: value is None)
    # The reservations (public ids) that need it, so the agent's report can name them.
    reservations: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(min_length=1, max_length=256)
    needed_at: datetime


class ImageReport(Strict):
    """What the agent knows of one image it was asked to pull (ahead, or for a launch): sent on every change and
    repeated until a heartbeat is answered."""

    image: Annotated[str, Field(min_length=1, max_length=512)]
    state: Literal["pulling", "present", "failed"]
    reservations: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list, max_length=256)
    # The repository digest the engine resolved (``sha256:...``) once present.
    digest: Annotated[str, Field(max_length=128)] | None = None
    size_bytes: Annotated[int, Field(ge=0, le=MAX_INT64)] | None = None
    progress: PullProgress | None = None
    # Why a pull failed, in the registry's or the engine's words (never with credentials).
    error: Annotated[str, Field(max_length=2000)] | None = None
    at: datetime


class DesiredContainer(Strict):
    """What must run on this node now. ``launch_id`` is stable, so a redelivered launch is a no-op."""

    launch_id: Annotated[str, Field(min_length=1, max_length=64)]
    reservation: Annotated[str, Field(min_length=1, max_length=64)]
    project: ShortText
    image: Annotated[str, Field(min_length=1, max_length=512)]
    command: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=256)
    env: dict[str, Annotated[str, Field(max_length=8192)]] = Field(default_factory=dict)
    gpu_uuids: list[Uuid] = Field(min_length=1, max_length=MAX_GPUS)
    window_start: datetime
    window_end: datetime
    warn_before_s: Annotated[int, Field(ge=0)] = 300
    stop_grace_s: Annotated[int, Field(ge=0, le=3600)] = 30
    memory_limit_mib: Annotated[int, Field(ge=0)] | None = None
    pids_limit: Annotated[int, Field(ge=0)] | None = None
    # The keys the gateway accepts for this reservation. The fields below are left out of the JSON at their
    # defaults, so an agent that predates them reads a desired state that needs none of them.
    ssh_keys: list[AuthorizedKey] = Field(
        default_factory=list, max_length=MAX_SSH_KEYS, exclude_if=lambda value: not value
    )
    volumes: list[VolumeMount] = Field(default_factory=list, max_length=MAX_VOLUMES, exclude_if=lambda value: not value)
    # "none": loopback only. "egress": the Docker network ``network_name`` the operator named for the project.
    network: Literal["none", "egress"] = Field(default="none", exclude_if=lambda value: value == "none")
    network_name: ShortText | None = Field(default=None, exclude_if=lambda value: value is None)
    # Why the window ends early (a preemption, docs/runtime.md): written into the warning file as ``reason``.
    notice_reason: Annotated[str, Field(max_length=200)] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )
    # Work the control plane would place elsewhere if this node were lost (its project opted in to requeue):
    # the agent fences it at the lease, and a watchdog inside its container stops it even when the agent cannot
    # (docs/runtime.md, "Lease watchdog"). Other work runs through a control-plane outage. Left out when false.
    replaceable: bool = Field(default=False, exclude_if=lambda value: not value)
    # Credentials for the image's registry (the project's, docs/images.md), when it has some for that registry.
    registry_auth: RegistryAuth | None = Field(default=None, exclude_if=lambda value: value is None)
    # The project secrets the booking asked for, with their values as of this launch.
    secrets: list[SecretValue] = Field(default_factory=list, max_length=MAX_SECRETS, exclude_if=lambda value: not value)
    # CPUs, /dev/shm and ulimits by the operator's policy; host memory is ``memory_limit_mib``.
    resources: ContainerResources | None = Field(default=None, exclude_if=lambda value: value is None)

    @model_validator(mode="after")
    def _egress_names_its_network(self) -> DesiredContainer:
        if self.network == "egress" and not self.network_name:
            raise PydanticCustomError("network_name", "an egress container names its Docker network", {})
        return self


class DesiredMig(Strict):
    """The MIG layout one GPU must have: MIG on or off, and its GPU instances by profile (one compute instance
    spanning each). The agent applies it only while no container of its own uses the GPU, and reports the
    outcome as a "mig" event naming ``generation``; the GPU's facts then show the layout it has."""

    uuid: Uuid
    enabled: bool
    layout: list[MigProfileName] = Field(default_factory=list, max_length=MAX_MIG_DEVICES)
    # The control plane's count of layouts asked for this GPU, so a report answers the request it belongs to.
    generation: Annotated[int, Field(ge=0)]


class HeartbeatReply(Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    server: ShortText
    server_state: ShortText
    heartbeat_interval_s: Annotated[float, Field(gt=0)]
    desired: list[DesiredContainer] = Field(default_factory=list)
    # Launch ids the agent must stop now even if still in their window (cancel, release).
    stop: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list)
    # The agent's lease: with no answered heartbeat for this long, it stops its containers (fencing). Sent only to
    # an agent that says it fences (``NodeFacts.fencing``), and left out of the JSON otherwise, because an older
    # agent refuses a reply with a field it does not know.
    lease_s: Annotated[float, Field(gt=0)] | None = Field(default=None, exclude_if=lambda value: value is None)
    # Seconds of silence that work nothing would replace survives: past this with no answered heartbeat, the agent
    # stops it too. Sent only to an agent that says it understands it (``NodeFacts.outage_tolerant``); without it
    # the agent fences every container at the lease, as before.
    outage_tolerance_s: Annotated[float, Field(gt=0)] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )
    # MIG layouts to apply. Sent only while an operator's reconfiguration waits, left out of the JSON otherwise.
    mig: list[DesiredMig] = Field(default_factory=list, max_length=MAX_GPUS, exclude_if=lambda value: not value)
    # Images to pull ahead of upcoming reservations' windows (docs/images.md). Sent only to an agent that says it
    # pulls (``NodeFacts.pulls``), and left out of the JSON when empty.
    prepull: list[PrePull] = Field(default_factory=list, max_length=MAX_PREPULLS, exclude_if=lambda value: not value)


class EnrollRequest(Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    join_token: Annotated[str, Field(min_length=8, max_length=256)]
    hostname: Annotated[str, Field(min_length=1, max_length=253)]
    simulated: bool = False


class EnrollReply(Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    server: ShortText
    credential: ShortText
    heartbeat_interval_s: Annotated[float, Field(gt=0)]


# -- live logs (POST /api/v1/agent/logs/) ---------------------------------------------------------------------

MAX_LOG_CHUNK_BYTES = 256 * 1024
MAX_LOG_CHUNKS = 64


class LogChunk(Strict):
    """Bytes a container wrote (stdout and stderr interleaved as Docker keeps them), from ``offset`` of its
    whole output. ``data`` is base64, so any byte reaches the control plane as written."""

    launch_id: Annotated[str, Field(min_length=1, max_length=64)]
    offset: Annotated[int, Field(ge=0)]
    data: Annotated[str, Field(max_length=(MAX_LOG_CHUNK_BYTES * 4) // 3 + 4)]
    # The container has exited and this chunk holds the last of its output.
    eof: bool = False


class LogBatch(Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    chunks: list[LogChunk] = Field(max_length=MAX_LOG_CHUNKS)


class LogBatchReply(Strict):
    """Per launch, the offset the control plane expects next: the agent resends from there, or skips ahead to
    it (what it has is kept already). A launch it does not know (not this node's) is left out."""

    schema_version: Literal[1] = SCHEMA_VERSION
    next_offsets: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
