"""A launch template as the API reads and writes it. Its ``container`` and ``spec`` are read by the booking's
own serializers (reservations/api/serializers.py), so a template holds nothing a booking would refuse for its
shape, and every rule and wording is the booking's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rest_framework import serializers

from controlplane.accounts.models import Project
from controlplane.core.api.fields import SlugRelatedField
from controlplane.reservations.api.fields import DurationField
from controlplane.reservations.api.serializers import (
    BookingSpecSerializer,
    ContainerSerializer,
    PortOutSerializer,
    ports_field,
    ports_out,
)
from controlplane.templates.models import DEFAULT_DURATION_S, NAME_MAX, name_validator

TITLE_MAX = 200
DESCRIPTION_MAX = 4000


class TemplateContainerSerializer(ContainerSerializer):
    """A booking's ``container``, read by the booking's own serializer (``secrets`` included: the same
    [{"name", "env", "file"}] a booking gives; their existence in the project is checked at booking). A
    template's named ports are its own ``ports``, given to each booking's ``container.ports``."""

    ports = None  # type: ignore[assignment]


class TemplateWriteSerializer(serializers.Serializer):
    """A template: a booking's ``container`` and ``spec`` (the same rules), named ports and a window length."""

    project = SlugRelatedField(
        slug_field="slug",
        queryset=Project.objects.none(),
        required=False,
        allow_null=True,
        default=None,
        help_text="The project's slug (its owners manage it); null: operator-wide (operators manage it).",
    )
    name = serializers.CharField(
        max_length=NAME_MAX,
        trim_whitespace=False,
        validators=[name_validator],
        help_text="Unique per project, and among operator-wide templates; a project's shadows an operator-wide one.",
    )
    title = serializers.CharField(max_length=TITLE_MAX, required=False, allow_blank=True, default="")
    description = serializers.CharField(max_length=DESCRIPTION_MAX, required=False, allow_blank=True, default="")
    container = TemplateContainerSerializer(help_text="A booking's container: image, command, env, secrets, ...")
    spec = BookingSpecSerializer(
        required=False, allow_null=True, default=None, help_text="A booking's spec, as its default; null: none."
    )
    ports = ports_field("Named web ports, as a booking's container.ports; a booking from the template gets them.")
    duration = DurationField(
        required=False,
        default=timedelta(seconds=DEFAULT_DURATION_S),
        help_text="The default window length, as a booking's window.duration; a booking giving only a start "
        "ends this long after it.",
    )

    def __init__(self, *args: Any, projects: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if projects is not None:
            self.fields["project"].queryset = projects  # type: ignore[attr-defined]


def stored_spec(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """A validated spec as the booking request would give it: the model by name, unset keys left out."""
    if spec is None:
        return None
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key == "gpu_model" and value is not None:
            value = value.name
        if value is None or (key == "slices" and value is False):
            continue
        out[key] = value
    return out


def stored_container(container: dict[str, Any]) -> dict[str, Any]:
    out = dict(container)
    out["volumes"] = [dict(m) for m in container.get("volumes", [])]
    if "secrets" in out:
        out["secrets"] = [{k: v for k, v in dict(s).items() if v is not None} for s in out["secrets"]]
    return out


class TemplateContainerOutSerializer(serializers.Serializer):
    image = serializers.CharField()
    command = serializers.ListField(child=serializers.CharField())
    env = serializers.DictField(child=serializers.CharField())
    secrets = serializers.ListField(child=serializers.DictField(), help_text='[{"name", "env", "file"}]')
    volumes = serializers.ListField(child=serializers.DictField(), help_text="As a booking's container.volumes.")
    network = serializers.CharField()


class TemplateSerializer(serializers.Serializer):
    project = serializers.CharField(allow_null=True, help_text="The project's slug; null: operator-wide.")
    name = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField()
    container = TemplateContainerOutSerializer()
    spec = serializers.DictField(allow_null=True, help_text="A booking's spec (gpu_model by name), or null.")
    ports = PortOutSerializer(many=True)
    duration = serializers.IntegerField(help_text="The default window length, in seconds.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


def template_answer(template: Any) -> dict[str, Any]:
    container = {"command": [], "env": {}, "secrets": [], "volumes": [], "network": "none", **template.container}
    return TemplateSerializer(
        {
            "project": template.project.slug if template.project_id else None,
            "name": template.name,
            "title": template.title,
            "description": template.description,
            "container": container,
            "spec": template.spec,
            "ports": ports_out(template.ports),
            "duration": template.duration_s,
            "created_at": template.created_at,
            "updated_at": template.updated_at,
        }
    ).data


class TemplateContainerChangeSerializer(TemplateContainerSerializer):
    """A change's container: the keys given replace the template's, so none is required here; the result is
    read whole by TemplateContainerSerializer."""

    image = serializers.CharField(max_length=ContainerSerializer().fields["image"].max_length, required=False)


class TemplateChangeSerializer(TemplateWriteSerializer):
    """A change (PATCH): any of a template's keys but its address (name and project, the URL's)."""

    project = None  # type: ignore[assignment]
    name = None  # type: ignore[assignment]
    container = TemplateContainerChangeSerializer(required=False, help_text="The keys to change, key by key.")
