"""Project secrets and registry credentials: set, replace, delete, and read for launches (docs/images.md).

Values are write-only: nothing here returns a value to an API answer, an event or a log line. Launches read
them through ``launch_material`` (the desired state: one query for all the launches of a heartbeat) and
``registry_auths_for`` (pre-pulls); a new value applies from the next launch that reads it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.vault import crypto
from controlplane.vault.models import EntryKind, VaultEntry
from nodeagent import imageref
from nodeagent.schema import RegistryAuth, SecretValue

log = logging.getLogger(__name__)

# The rules of a secret's name and value, and of a registry credential: the wire's own bounds
# (nodeagent/schema.py, SecretName, SecretValue, RegistryAuth).
SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_NAME_MAX = 63
SECRET_VALUE_MAX = 65536
REGISTRY_MAX = 253
USERNAME_MAX = 256
PASSWORD_MAX = 8192
# How many of each a project may hold.
SECRETS_PER_PROJECT = 200
REGISTRIES_PER_PROJECT = 50


def secret_name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not SECRET_NAME.fullmatch(name):
        return "Letters, digits and _, not starting with a digit (a secret's name is also its file's name)."
    if len(name) > SECRET_NAME_MAX:
        return f"Ensure this name has no more than {SECRET_NAME_MAX} characters."
    return None


def _value_problem(value: object, maximum: int) -> str | None:
    if not isinstance(value, str):
        return "Must be a string."
    if not value:
        return "Must not be empty."
    if len(value) > maximum:
        return f"Ensure this value has no more than {maximum} characters."
    if "\x00" in value:
        return "Must not contain a NUL character."
    return None


def secret_value_problem(value: object) -> str | None:
    return _value_problem(value, SECRET_VALUE_MAX)


def password_problem(value: object) -> str | None:
    return _value_problem(value, PASSWORD_MAX)


def registry_host(text: object) -> str:
    """``text`` as the registry part of an image reference reads it (lowercase; Docker Hub's aliases as
    docker.io), or ValidationFailed naming ``registry``."""
    problem = "Give the registry as an image reference names it: host[:port], e.g. docker.io, nvcr.io, 127.0.0.1:5000."
    if not isinstance(text, str) or not text or len(text) > REGISTRY_MAX or "/" in text:
        raise ValidationFailed(f"registry: {problem}", fields={"registry": [problem]})
    host = text.lower()
    if host in (imageref.DOCKER_HUB, "index.docker.io", imageref.DOCKER_HUB_API):
        return imageref.DOCKER_HUB
    try:
        ref = imageref.parse(f"{host}/probe")
    except imageref.ImageRefError:
        raise ValidationFailed(f"registry: {problem}", fields={"registry": [problem]}) from None
    # "myhost/probe" reads as a Docker Hub repository: a host needs a dot or a port, or is localhost.
    if ref.registry != host:
        raise ValidationFailed(f"registry: {problem}", fields={"registry": [problem]})
    return host


def image_registry(image: str) -> str | None:
    """The registry (lowercase host[:port]) of ``image``, or None when it is not an image reference."""
    try:
        return imageref.parse(image).registry.lower()
    except imageref.ImageRefError:
        return None


# -- writes -------------------------------------------------------------------------------------------------


def _user(actor: Any) -> Any:
    return actor if getattr(actor, "is_authenticated", False) else None


def _count(project: Project, kind: str) -> int:
    return VaultEntry.objects.filter(project=project, kind=kind).count()


@transaction.atomic
def _put(
    *, project: Project, kind: str, name: str, username: str, value: str, actor: Any, create_only: bool, limit: int
) -> tuple[VaultEntry, bool]:
    now = timezone.now()
    sealed = crypto.seal(value)
    entry = VaultEntry.objects.select_for_update().filter(project=project, kind=kind, name=name).first()
    if entry is not None:
        if create_only:
            what = "secret" if kind == EntryKind.SECRET else "credential for"
            raise Conflict(
                f"The project has a {what} {name} already; PUT it to replace the value.", code=f"{kind}_exists"
            )
        entry.username, entry.sealed, entry.updated_by, entry.updated_at = username, sealed, _user(actor), now
        entry.save(update_fields=["username", "sealed", "updated_by", "updated_at"])
        return entry, False
    if _count(project, kind) >= limit:
        raise Conflict(f"A project holds at most {limit} of these; delete one first.", code="vault_full")
    try:
        with transaction.atomic():
            entry = VaultEntry.objects.create(
                project=project,
                kind=kind,
                name=name,
                username=username,
                sealed=sealed,
                created_by=_user(actor),
                updated_by=_user(actor),
                created_at=now,
                updated_at=now,
            )
    except IntegrityError:
        raise Conflict(
            f"{name} was set by another request at the same moment; try again.", code=f"{kind}_exists"
        ) from None
    return entry, True


def secret_set(
    *, project: Project, name: str, value: str, actor: Any, create_only: bool = False
) -> tuple[VaultEntry, bool]:
    """Set (or replace) the secret ``name``; (entry, created). The value applies from the next launch."""
    fields: dict[str, list[str]] = {}
    if (problem := secret_name_problem(name)) is not None:
        fields["name"] = [problem]
    if (problem := secret_value_problem(value)) is not None:
        fields["value"] = [problem]
    if fields:
        raise ValidationFailed("; ".join(f"{k}: {v[0]}" for k, v in fields.items()), fields=fields)
    return _put(
        project=project,
        kind=EntryKind.SECRET,
        name=name,
        username="",
        value=value,
        actor=actor,
        create_only=create_only,
        limit=SECRETS_PER_PROJECT,
    )


def registry_set(
    *, project: Project, registry: str, username: str, password: str, actor: Any, create_only: bool = False
) -> tuple[VaultEntry, bool]:
    """Set (or replace) the project's credential for ``registry``; (entry, created)."""
    host = registry_host(registry)
    fields: dict[str, list[str]] = {}
    if not isinstance(username, str) or not username or len(username) > USERNAME_MAX or "\x00" in username:
        fields["username"] = [f"A user name of 1 to {USERNAME_MAX} characters."]
    if (problem := password_problem(password)) is not None:
        fields["password"] = [problem]
    if fields:
        raise ValidationFailed("; ".join(f"{k}: {v[0]}" for k, v in fields.items()), fields=fields)
    return _put(
        project=project,
        kind=EntryKind.REGISTRY,
        name=host,
        username=username,
        value=password,
        actor=actor,
        create_only=create_only,
        limit=REGISTRIES_PER_PROJECT,
    )


# Who still needs a secret: apps above this one (reservations, the queue) register a reader that names the
# reservations or queued requests of ``project`` not yet ended that ask for the secret ``name``.
SecretUsers = Callable[[int, str], list[str]]
_secret_users: list[SecretUsers] = []


def register_secret_users(reader: SecretUsers) -> None:
    if reader not in _secret_users:
        _secret_users.append(reader)


@transaction.atomic
def secret_delete(*, entry: VaultEntry, actor: Any) -> None:
    """Delete a secret; 409 ``secret_in_use`` while a reservation not yet ended, or a queued request, asks for it
    (its launch would start without it)."""
    from controlplane.ledger.services import lock_project

    # Under the project's lock, as bookings check the names they ask for: no booking slips in between.
    lock_project(project_id=entry.project_id)
    users = [who for reader in _secret_users for who in reader(entry.project_id, entry.name)]
    if users:
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        raise Conflict(
            f"The secret {entry.name} is asked for by {shown}; cancel them, or replace the value instead.",
            code="secret_in_use",
            extra={"used_by": users[:50]},
        )
    entry.delete()


def registry_delete(*, entry: VaultEntry, actor: Any) -> None:
    """Forget a registry credential: launches after this pull without it."""
    entry.delete()


# -- reads for bookings and launches ------------------------------------------------------------------------


def missing_secrets(*, project: Project, names: Sequence[str]) -> dict[str, list[str]]:
    """Per field (``container.secrets.<i>.name``), the secrets ``names`` asks for that ``project`` does not have.
    Nothing asked, nothing read."""
    if not names:
        return {}
    have = set(
        VaultEntry.objects.filter(project=project, kind=EntryKind.SECRET, name__in=set(names)).values_list(
            "name", flat=True
        )
    )
    return {
        f"container.secrets.{i}.name": [f"The project has no secret named {name}; set it under its secrets first."]
        for i, name in enumerate(names)
        if name not in have
    }


def _auth(entry: VaultEntry) -> RegistryAuth | None:
    try:
        return RegistryAuth(registry=entry.name, username=entry.username, password=crypto.unseal(entry.sealed))
    except crypto.UndecryptableError:
        log.error("registry credential for %s of project %s cannot be decrypted", entry.name, entry.project_id)
        return None


def registry_auths_for(pairs: Iterable[tuple[int, str]]) -> dict[tuple[int, str], RegistryAuth]:
    """For each (project id, image), the project's credential for the image's registry, where it has one: one
    query for all of them (a pre-pull batch, a heartbeat)."""
    wanted: dict[tuple[int, str], str] = {}
    for project_id, image in pairs:
        registry = image_registry(image)
        if registry is not None:
            wanted[(project_id, image)] = registry
    if not wanted:
        return {}
    entries = VaultEntry.objects.filter(
        kind=EntryKind.REGISTRY,
        project_id__in={p for p, _ in wanted},
        name__in=set(wanted.values()),
    )
    by_key = {(e.project_id, e.name): e for e in entries}
    found: dict[tuple[int, str], RegistryAuth] = {}
    for key, registry in wanted.items():
        entry = by_key.get((key[0], registry))
        if entry is not None and (auth := _auth(entry)) is not None:
            found[key] = auth
    return found


def registry_auth_for(project: Project | int, image: str) -> RegistryAuth | None:
    """The project's credential for the registry ``image`` is pulled from, or None."""
    project_id = project if isinstance(project, int) else project.pk
    return registry_auths_for([(project_id, image)]).get((project_id, image))


def registry_entry(project: Project | int, registry: str) -> VaultEntry | None:
    project_id = project if isinstance(project, int) else project.pk
    return VaultEntry.objects.filter(project_id=project_id, kind=EntryKind.REGISTRY, name=registry).first()


@dataclass(frozen=True)
class LaunchMaterial:
    registry_auth: RegistryAuth | None
    secrets: list[SecretValue]
    # Secrets asked for that the project no longer has, or that cannot be decrypted (names only).
    missing: list[str]


def launch_material(reservations: Collection[Any]) -> dict[int, LaunchMaterial]:
    """Per reservation id: its registry credential and its secrets' values, as of now. One query for all of
    ``reservations`` (each needs ``pk``, ``project_id``, ``image`` and ``secrets``, the stored requests), and none
    when there are none."""
    if not reservations:
        return {}
    projects = {r.project_id for r in reservations}
    registries = {reg for r in reservations if (reg := image_registry(r.image)) is not None}
    names = {str(s["name"]) for r in reservations for s in (r.secrets or [])}
    condition = Q(kind=EntryKind.REGISTRY, name__in=registries)
    if names:
        condition |= Q(kind=EntryKind.SECRET, name__in=names)
    entries = {(e.project_id, e.kind, e.name): e for e in VaultEntry.objects.filter(condition, project_id__in=projects)}
    opened: dict[int, str | None] = {}

    def value_of(entry: VaultEntry) -> str | None:
        if entry.pk not in opened:
            try:
                opened[entry.pk] = crypto.unseal(entry.sealed)
            except crypto.UndecryptableError:
                log.error("secret %s of project %s cannot be decrypted", entry.name, entry.project_id)
                opened[entry.pk] = None
        return opened[entry.pk]

    material: dict[int, LaunchMaterial] = {}
    for r in reservations:
        registry = image_registry(r.image)
        auth_entry = entries.get((r.project_id, EntryKind.REGISTRY, registry)) if registry else None
        auth = None
        if auth_entry is not None and (password := value_of(auth_entry)) is not None:
            auth = RegistryAuth(registry=auth_entry.name, username=auth_entry.username, password=password)
        values: list[SecretValue] = []
        missing: list[str] = []
        for wanted in r.secrets or []:
            entry = entries.get((r.project_id, EntryKind.SECRET, wanted["name"]))
            value = value_of(entry) if entry is not None else None
            if value is None:
                missing.append(str(wanted["name"]))
                continue
            values.append(
                SecretValue(name=wanted["name"], value=value, env=wanted.get("env"), file=bool(wanted.get("file")))
            )
        material[r.pk] = LaunchMaterial(registry_auth=auth, secrets=values, missing=missing)
    return material


def rotate_keys() -> int:
    """Re-encrypt every stored value under the first key; how many were rewritten."""
    count = 0
    for entry in VaultEntry.objects.all().only("pk", "sealed").iterator():
        VaultEntry.objects.filter(pk=entry.pk).update(sealed=crypto.reseal(entry.sealed))
        count += 1
    return count
