"""Writes to SSH keys. The API and the admin call these and nothing else."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from controlplane.access import sshkeys
from controlplane.access.models import SshKey
from controlplane.accounts import selectors as accounts
from controlplane.core.errors import NotFound, ValidationFailed

log = logging.getLogger(__name__)

NAME_MAX = SshKey._meta.get_field("name").max_length or 100
# Every key of every member of a project travels to the node in its desired state: a bound keeps that small.
KEYS_PER_USER_MAX = 50


@transaction.atomic
def ssh_key_create(*, user: Any, name: str, public_key: str, actor: Any) -> SshKey:
    """Register ``public_key`` (one OpenSSH line) for ``user`` under ``name``.

    Refused with a 400 naming the field: a key ``sshkeys.parse_public_key`` refuses, a key the user holds
    already (same fingerprint), a name the user uses already, a blank or long name, and a key past the
    user's ``KEYS_PER_USER_MAX``.
    """
    parsed = sshkeys.parse_public_key(public_key)
    name = name.strip()
    if not name:
        raise ValidationFailed("The key needs a name.", fields={"name": ["This field may not be blank."]})
    if len(name) > NAME_MAX:
        message = f"Ensure this field has no more than {NAME_MAX} characters."
        raise ValidationFailed(message, fields={"name": [message]})
    # The user's row lock serialises one user's key writes, so the checks below still hold at the insert.
    get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
    _refuse_duplicate(user=user, name=name, fingerprint=parsed.fingerprint)
    if SshKey.objects.filter(user=user).count() >= KEYS_PER_USER_MAX:
        raise sshkeys.refuse(
            f"You have {KEYS_PER_USER_MAX} keys, the most a user may hold; remove one first.", code="too_many_keys"
        )
    try:
        with transaction.atomic():
            key = SshKey.objects.create(
                user=user,
                name=name,
                key_type=parsed.key_type,
                bits=parsed.bits,
                public_key=parsed.public_key,
                comment=parsed.comment,
                fingerprint=parsed.fingerprint,
            )
    except IntegrityError:
        # SQLite ignores the row lock: a concurrent insert can still win; its row says which rule it broke.
        _refuse_duplicate(user=user, name=name, fingerprint=parsed.fingerprint)
        raise
    log.info(
        "ssh key added: user=%s key=%s name=%r fingerprint=%s type=%s by=%s",
        user.get_username(), key.pk, key.name, key.fingerprint, key.key_type, _who(actor),
    )  # fmt: skip
    return key


@transaction.atomic
def ssh_key_delete(*, key: SshKey, actor: Any) -> None:
    """Remove a key, for good. Its user and operators (through the admin) may."""
    if key.user_id != getattr(actor, "pk", None) and not accounts.is_operator(actor):
        raise NotFound("No such key.")
    deleted, _ = SshKey.objects.filter(pk=key.pk).delete()
    if deleted == 0:
        # Another request removed it first: to this one it is gone, as it would be a moment later.
        raise NotFound("No such key.")
    log.info(
        "ssh key removed: user=%s key=%s name=%r fingerprint=%s by=%s",
        key.user.get_username(), key.pk, key.name, key.fingerprint, _who(actor),
    )  # fmt: skip


def _refuse_duplicate(*, user: Any, name: str, fingerprint: str) -> None:
    held = SshKey.objects.filter(user=user, fingerprint=fingerprint).values_list("name", flat=True).first()
    if held is not None:
        raise sshkeys.refuse(f"You have added this key already, as {held!r} ({fingerprint}).", code="duplicate_key")
    if SshKey.objects.filter(user=user, name=name).exists():
        message = f"You have a key named {name!r} already; choose another name."
        raise ValidationFailed(message, code="duplicate_name", fields={"name": [message]})


def _who(actor: Any) -> str:
    return actor.get_username() if getattr(actor, "is_authenticated", False) else "system"
