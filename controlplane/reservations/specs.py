"""Plain values that describe a booking, validated once here whether they come from the API or from code."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.crypto import salted_hmac

from controlplane.core.errors import ValidationFailed
from controlplane.reservations.choices import NetworkMode
from controlplane.vault.registry import image_problem
from nodeagent.schema import MAX_SECRETS, MAX_VOLUMES, mount_path_problem, runtime_env

# A client clock a little behind ours must not make "start now" fail.
START_SKEW = timedelta(minutes=2)


@dataclass(frozen=True)
class GpuSpec:
    gpu_model_id: int | None = None
    min_memory_mib: int | None = None
    gpu_count: int | None = None
    whole_servers: int | None = None
    # A slice booking: ``gpu_count`` MIG devices of this profile ("1g.10gb"), instead of a model or memory.
    mig_profile: str | None = None
    # With ``min_memory_mib``: each of ``gpu_count`` units may be a MIG slice with at least that memory, on
    # the smallest profile that has them free, else a whole GPU (docs/fractional.md, "Slices by memory").
    slices: bool = False

    @property
    def whole_only(self) -> GpuSpec:
        """This spec asking for whole GPUs alone: what a slices-by-memory spec falls back to."""
        return replace(self, slices=False, mig_profile=None)

    def validate(self) -> None:
        fields: dict[str, list[str]] = {}
        if self.slices:
            fields.update(self._slices_problems())
        if self.mig_profile is not None:
            fields.update(self._mig_problems())
        elif (self.gpu_model_id is None) == (self.min_memory_mib is None):
            fields["spec.gpu_model"] = ["Give either a GPU model or a minimum GPU memory, not both or neither."]
        if self.min_memory_mib is not None and self.min_memory_mib < 1:
            fields["spec.min_memory_mib"] = ["Must be at least 1."]
        if (self.gpu_count is None) == (self.whole_servers is None):
            fields["spec.gpu_count"] = ["Give either a GPU count or a number of whole servers, not both or neither."]
        if self.gpu_count is not None and self.gpu_count < 1:
            fields["spec.gpu_count"] = ["Must be at least 1."]
        if self.whole_servers is not None and self.whole_servers < 1:
            fields["spec.whole_servers"] = ["Must be at least 1."]
        if fields:
            raise ValidationFailed(_sentence(fields), fields=fields)

    def _slices_problems(self) -> dict[str, list[str]]:
        fields: dict[str, list[str]] = {}
        if self.mig_profile is not None:
            fields["spec.slices"] = ["A MIG profile books slices already; give slices with a minimum memory instead."]
        elif self.min_memory_mib is None or self.gpu_model_id is not None:
            fields["spec.slices"] = ["Slices are asked for by a minimum memory (spec.min_memory_mib), not a model."]
        if self.whole_servers is not None:
            fields["spec.whole_servers"] = ["Slices are booked by count (spec.gpu_count), not as whole servers."]
        return fields

    def _mig_problems(self) -> dict[str, list[str]]:
        fields: dict[str, list[str]] = {}
        profile = self.mig_profile or ""
        if not MIG_PROFILE_RE.fullmatch(profile):
            fields["spec.mig_profile"] = [
                f'"{profile}" is not a MIG profile name; give one as nvidia-smi names it, e.g. "1g.10gb".'
            ]
        if self.gpu_model_id is not None or self.min_memory_mib is not None:
            fields["spec.mig_profile"] = [
                *fields.get("spec.mig_profile", []),
                "Give a MIG profile instead of a GPU model or a minimum memory, not with them.",
            ]
        if self.whole_servers is not None:
            fields["spec.whole_servers"] = ["Slices are booked by count (spec.gpu_count), not as whole servers."]
        return fields


# "1g.10gb", "3g.40gb", "1g.10gb+me", "7g.80gb" (docs/fractional.md, "Profiles").
MIG_PROFILE_RE = re.compile(r"[1-7]g\.[1-9][0-9]{0,3}gb(\+me)?")


@dataclass(frozen=True)
class Window:
    starts_at: datetime
    ends_at: datetime

    @property
    def seconds(self) -> float:
        return (self.ends_at - self.starts_at).total_seconds()

    def validate(self, *, now: datetime | None = None, future_only: bool = True) -> None:
        now = now or timezone.now()
        fields: dict[str, list[str]] = {}
        if self.ends_at <= self.starts_at:
            fields["window.end"] = ["The window must end after it starts."]
        if future_only and self.starts_at < now - START_SKEW:
            fields["window.start"] = ['The window cannot start in the past; use "now" to start at once.']
        if fields:
            raise ValidationFailed(_sentence(fields), fields=fields)


VOLUME_PATH_DEFAULT = "/workspace"
DATASET_ROOT = "/datasets"


@dataclass(frozen=True)
class MountRequest:
    """One mount a booking asks for: a project volume or an operator's dataset, by name, at ``path``.

    ``path`` None takes the default: /workspace for a volume, /datasets/<name> for a dataset. A dataset is
    always read-only; ``read_only=False`` asked of one is refused rather than quietly ignored.
    """

    kind: str  # "volume" | "dataset"
    name: str
    path: str | None = None
    read_only: bool | None = None

    @property
    def mount_path(self) -> str:
        if self.path is not None:
            return self.path
        return VOLUME_PATH_DEFAULT if self.kind == "volume" else f"{DATASET_ROOT}/{self.name}"

    @property
    def mount_read_only(self) -> bool:
        return True if self.kind == "dataset" else bool(self.read_only)


def mounts_from_stored(volumes: list[dict[str, object]]) -> list[MountRequest]:
    """A reservation's stored mounts (``Reservation.volumes``) asked for again: a requeued follow-up's."""
    return [
        MountRequest(kind=str(m["kind"]), name=str(m["name"]), path=str(m["path"]), read_only=bool(m["read_only"]))
        for m in volumes
    ]


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def mount_problems(volumes: list[MountRequest]) -> dict[str, list[str]]:
    """Per field (``container.volumes.<i>.<part>``), what is wrong with the mounts as a list: each path by
    ``nodeagent.schema.mount_path_problem`` (the agent's own rule), then paths that repeat or nest inside
    another (which mount would win is not the booking's to guess), and a volume or dataset named twice."""
    fields: dict[str, list[str]] = {}
    if len(volumes) > MAX_VOLUMES:
        fields["container.volumes"] = [f"Ensure this field has no more than {MAX_VOLUMES} elements."]
        return fields
    seen_paths: list[tuple[int, str]] = []
    seen_names: dict[tuple[str, str], int] = {}
    for i, mount in enumerate(volumes):
        at = f"container.volumes.{i}"
        if mount.kind == "dataset" and mount.read_only is False:
            fields[f"{at}.read_only"] = ["A dataset is always mounted read-only."]
        path = mount.mount_path
        problem = mount_path_problem(path)
        if problem is not None:
            fields[f"{at}.path"] = [problem]
        else:
            clash = next((j for j, other in seen_paths if _nested(path, other)), None)
            if clash is not None:
                other = volumes[clash].mount_path
                why = "is already a mount point" if other == path else f"nests with {other}"
                fields[f"{at}.path"] = [f"{path} {why} (container.volumes.{clash}); give each mount its own path."]
            seen_paths.append((i, path))
        key = (mount.kind, mount.name)
        if key in seen_names:
            fields[f"{at}.{mount.kind}"] = [
                f"The {mount.kind} {mount.name!r} is mounted already (container.volumes.{seen_names[key]})."
            ]
        seen_names.setdefault(key, i)
    return fields


# -- Secrets a booking asks for (docs/images.md, "Secrets in a booking") -------------------------------------
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def runtime_env_problem(name: str) -> str | None:
    # The variables the runtime sets in every container (the agent's own rule): a secret may not take one.
    if runtime_env(name):
        return f"{name} is set by the runtime itself; give the secret another variable name."
    return None


@dataclass(frozen=True)
class SecretRequest:
    """One project secret a booking asks for, by name: as the variable ``env``, as the file
    /run/secrets/<name> (``file``), or both. Neither given: the variable of the secret's own name."""

    name: str
    env: str | None = None
    file: bool = False

    @classmethod
    def of(cls, name: str, env: str | None = None, file: bool | None = None) -> SecretRequest:
        """With the defaults applied: no env and no file is the variable of the secret's own name."""
        if env is None and not file:
            env = name
        return cls(name=name, env=env, file=bool(file))

    def stored(self) -> dict[str, object]:
        return {"name": self.name, "env": self.env, "file": self.file}


def secrets_from_stored(secrets: list[dict[str, object]]) -> list[SecretRequest]:
    """A reservation's stored secrets (``Reservation.secrets``) asked for again: a requeued follow-up's."""
    return [
        SecretRequest(
            name=str(s["name"]), env=None if s.get("env") is None else str(s["env"]), file=bool(s.get("file"))
        )
        for s in secrets
    ]


def secret_problems(secrets: list[SecretRequest], env: dict[str, str]) -> dict[str, list[str]]:
    """Per field (``container.secrets.<i>.<part>``), what is wrong with the secrets asked for, as a list: names
    and variables by the wire's patterns, a variable of the runtime's own or one ``container.env`` sets too, and
    a secret or a variable named twice. Whether the project has them is the booking's to check."""
    fields: dict[str, list[str]] = {}
    if len(secrets) > MAX_SECRETS:
        return {"container.secrets": [f"Ensure this field has no more than {MAX_SECRETS} elements."]}
    names: dict[str, int] = {}
    variables: dict[str, int] = {}
    for i, secret in enumerate(secrets):
        at = f"container.secrets.{i}"
        if not isinstance(secret.name, str) or not _ENV_NAME_RE.fullmatch(secret.name) or len(secret.name) > 63:
            fields[f"{at}.name"] = ["A secret's name: letters, digits and _, not starting with a digit (at most 63)."]
        elif secret.name in names:
            fields[f"{at}.name"] = [
                f"The secret {secret.name} is asked for already (container.secrets.{names[secret.name]})."
            ]
        else:
            names[secret.name] = i
        if secret.env is None and not secret.file:
            fields[f"{at}.env"] = ["A secret goes to a variable (env), a file (file: true), or both."]
        if secret.env is not None:
            if not isinstance(secret.env, str) or not _ENV_NAME_RE.fullmatch(secret.env) or len(secret.env) > 255:
                fields[f"{at}.env"] = ["Not a valid variable name: letters, digits and _, not starting with a digit."]
            elif (problem := runtime_env_problem(secret.env)) is not None:
                fields[f"{at}.env"] = [problem]
            elif secret.env in env:
                fields[f"{at}.env"] = [f"container.env sets {secret.env} too; give one of them another name."]
            elif secret.env in variables:
                fields[f"{at}.env"] = [
                    f"The variable {secret.env} is taken by container.secrets.{variables[secret.env]}."
                ]
            else:
                variables[secret.env] = i
    return fields


# Named ports (docs/proxy.md, "Named ports"): what the container serves, by name, for the browser proxy.
MAX_PORTS = 16
PORT_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
PORT_PROTOCOLS = ("http", "https", "tcp")
# "jupyter": the control plane makes the reservation a token, gives it to the container as JUPYTER_TOKEN and the
# proxy signs every request in with it (docs/proxy.md, "JupyterLab in one click").
PORT_AUTHS = ("none", "jupyter")
# The variable each auth scheme hands its token to the container in.
PORT_AUTH_ENV = {"jupyter": "JUPYTER_TOKEN"}
# Names the proxy keeps for itself: the web terminal.
RESERVED_PORT_NAMES = frozenset({"terminal"})
_PORT_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/?#-]{0,511}")


@dataclass(frozen=True)
class WebPort:
    """One port the container serves, by name (``jupyter``: 8888), and how the proxy opens it: ``protocol``
    (only ``http`` opens in the browser), ``path`` (where Open lands) and ``auth`` (a token the proxy signs in
    with)."""

    name: str
    port: int
    protocol: str = "http"
    path: str = "/"
    auth: str = "none"

    def stored(self) -> dict[str, object]:
        return {"name": self.name, "port": self.port, "protocol": self.protocol, "path": self.path, "auth": self.auth}


def ports_from_stored(ports: list[dict[str, object]]) -> list[WebPort]:
    """Stored ports (``Reservation.ports``, a template's, a queued request's) as values again; older rows may
    lack the keys that came later, which take their defaults."""
    return [
        WebPort(
            name=str(p["name"]),
            port=int(p["port"]),  # type: ignore[call-overload]
            protocol=str(p.get("protocol") or "http"),
            path=str(p.get("path") or "/"),
            auth=str(p.get("auth") or "none"),
        )
        for p in ports
    ]


def app_token(reservation: str) -> str:
    """The token of a reservation's signing-in port (``auth`` other than "none"): derived from SECRET_KEY and the
    reservation's public id, so the desired state (the container's variable) and the proxy (the header it signs
    in with) agree without storing it."""
    return salted_hmac("gpucp.reservations.app-token", reservation, algorithm="sha256").hexdigest()[:48]


def port_auth_env(reservation: str, ports: list[dict[str, object]] | None) -> dict[str, str]:
    """The variables a reservation's container gets for its signing-in port: ``{"JUPYTER_TOKEN": <token>}``."""
    for port in ports_from_stored(list(ports or [])):
        if port.auth in PORT_AUTH_ENV:
            return {PORT_AUTH_ENV[port.auth]: app_token(reservation)}
    return {}


def port_problems(ports: list[WebPort], env: dict[str, str], *, at: str = "container.ports") -> dict[str, list[str]]:
    """Per field (``container.ports.<i>.<part>``), what is wrong with the named ports: the name's pattern, a
    reserved name, a port out of range, a name or a port given twice, an unknown protocol or auth, a path that
    is not absolute, an auth on a port that is not http, two ports signing in, and an auth's variable that
    ``container.env`` sets too."""
    if len(ports) > MAX_PORTS:
        return {at: [f"Ensure this field has no more than {MAX_PORTS} elements."]}
    fields: dict[str, list[str]] = {}
    names: dict[str, int] = {}
    numbers: dict[int, int] = {}
    signing: int | None = None
    for i, port in enumerate(ports):
        field_at = f"{at}.{i}"
        if not isinstance(port.name, str) or not PORT_NAME.fullmatch(port.name):
            fields[f"{field_at}.name"] = [
                "A port's name: lowercase letters, digits and '-', starting with a letter (at most 32)."
            ]
        elif port.name in RESERVED_PORT_NAMES:
            fields[f"{field_at}.name"] = [f'"{port.name}" is the web terminal\'s; give the port another name.']
        elif port.name in names:
            fields[f"{field_at}.name"] = [f"The name {port.name} is taken by {at}.{names[port.name]}."]
        else:
            names[port.name] = i
        if isinstance(port.port, bool) or not isinstance(port.port, int) or not 1 <= port.port <= 65535:
            fields[f"{field_at}.port"] = ["A TCP port from 1 to 65535."]
        elif port.port in numbers:
            fields[f"{field_at}.port"] = [f"The port {port.port} is taken by {at}.{numbers[port.port]}."]
        else:
            numbers[port.port] = i
        if port.protocol not in PORT_PROTOCOLS:
            fields[f"{field_at}.protocol"] = [f'"{port.protocol}" is not a valid choice: "http", "https" or "tcp".']
        if not isinstance(port.path, str) or not _PORT_PATH.fullmatch(port.path) or port.path.startswith("//"):
            fields[f"{field_at}.path"] = ['A path on the app, starting with one "/" (at most 512 characters).']
        if port.auth not in PORT_AUTHS:
            fields[f"{field_at}.auth"] = [f'"{port.auth}" is not a valid choice: "none" or "jupyter".']
        elif port.auth != "none":
            if port.protocol != "http":
                fields[f"{field_at}.auth"] = ["Only an http port signs in through the proxy."]
            elif signing is not None:
                fields[f"{field_at}.auth"] = [f"{at}.{signing} signs in already; one port may."]
            elif PORT_AUTH_ENV[port.auth] in env:
                fields[f"{field_at}.auth"] = [
                    f"container.env or a secret sets {PORT_AUTH_ENV[port.auth]}, which this auth sets."
                ]
            else:
                signing = i
    return fields


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    volumes: list[MountRequest] = field(default_factory=list)
    network: str = NetworkMode.NONE
    secrets: list[SecretRequest] = field(default_factory=list)
    ports: list[WebPort] = field(default_factory=list)

    def validate(self) -> None:
        fields: dict[str, list[str]] = {}
        if self.network not in NetworkMode.values:
            fields["container.network"] = [f'"{self.network}" is not a valid choice: "none" or "egress".']
        fields.update(mount_problems(list(self.volumes)))
        if not self.image or not self.image.strip():
            fields["container.image"] = ["This field is required."]
        elif (problem := image_problem(self.image.strip())) is not None:
            fields["container.image"] = [problem]
        if not isinstance(self.command, list) or not all(isinstance(part, str) for part in self.command):
            fields["container.command"] = ["Must be a list of strings."]
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            fields["container.env"] = ["Must be a map of strings to strings."]
        fields.update(secret_problems(list(self.secrets), self.env if isinstance(self.env, dict) else {}))
        taken = dict(self.env) if isinstance(self.env, dict) else {}
        taken.update({secret.env: "" for secret in self.secrets if isinstance(secret.env, str)})
        fields.update(port_problems(list(self.ports), taken))
        if fields:
            raise ValidationFailed(_sentence(fields), fields=fields)


def _sentence(fields: dict[str, list[str]]) -> str:
    return "; ".join(f"{name}: {' '.join(messages)}" for name, messages in fields.items())
