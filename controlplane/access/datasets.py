"""Datasets: read-only directories operators provide, and the projects that may mount them (docs/volumes.md).

A dataset lives on the agents' storage, put there by an operator; the control plane only names it and says
who may mount it. Taking a project off ``allowed_projects`` (or deleting the dataset) refuses its new
bookings; reservations booked already keep the mount they were given.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from controlplane.access.models import Dataset
from controlplane.accounts.models import Project
from controlplane.core.errors import ValidationFailed
from controlplane.ledger.services import actor_label_for

log = logging.getLogger(__name__)
_UNSET: Any = object()


def _clean(dataset: Dataset) -> None:
    try:
        dataset.full_clean(validate_unique=False)
    except ValidationError as exc:
        fields = {name: [str(m) for m in messages] for name, messages in exc.message_dict.items()}
        raise ValidationFailed("; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items()), fields=fields) from None


def _duplicate(name: str) -> ValidationFailed:
    message = f"There is a dataset named {name!r} already."
    return ValidationFailed(message, code="duplicate_name", fields={"name": [message]})


@transaction.atomic
def dataset_create(
    *, name: str, description: str = "", allowed_projects: Iterable[Project] = (), actor: Any
) -> Dataset:
    dataset = Dataset(name=name, description=description or "")
    _clean(dataset)
    if Dataset.objects.filter(name=name).exists():
        raise _duplicate(name)
    try:
        with transaction.atomic():
            dataset.save()
    except IntegrityError:
        raise _duplicate(name) from None
    dataset.allowed_projects.set(list(allowed_projects))
    log.info("dataset declared: %s by=%s", name, actor_label_for(actor))
    return dataset


@transaction.atomic
def dataset_update(
    *, dataset: Dataset, actor: Any, description: Any = _UNSET, allowed_projects: Any = _UNSET
) -> Dataset:
    """Change what a dataset says and who may mount it; its name is its directory and does not change."""
    if description is not _UNSET:
        dataset.description = description or ""
        _clean(dataset)
        dataset.save(update_fields=["description"])
    if allowed_projects is not _UNSET:
        dataset.allowed_projects.set(list(allowed_projects))
    log.info("dataset changed: %s by=%s", dataset.name, actor_label_for(actor))
    return dataset


@transaction.atomic
def dataset_delete(*, dataset: Dataset, actor: Any) -> None:
    name = dataset.name
    dataset.delete()
    log.info("dataset removed (its files are left on disk): %s by=%s", name, actor_label_for(actor))
