from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.accounts.models import Project
from controlplane.core.api.fields import AwareDateTimeField, SlugRelatedField, StrictBooleanField
from controlplane.inventory.models import GpuModel
from controlplane.reservations import hooks, resources
from controlplane.reservations.api.fields import (
    DurationField,
    EnvField,
    GpuModelField,
    StartField,
    StrictStringField,
)
from controlplane.reservations.choices import NetworkMode
from controlplane.reservations.costs import cost_for
from controlplane.reservations.models import Allocation, Reservation, ReservationEvent
from controlplane.reservations.specs import (
    MIG_PROFILE_RE,
    PORT_AUTHS,
    PORT_PROTOCOLS,
    START_SKEW,
    ContainerSpec,
    GpuSpec,
    MountRequest,
    SecretRequest,
    WebPort,
    Window,
    ports_from_stored,
)
from nodeagent.schema import MAX_SECRETS, MAX_VOLUMES

# Bounds of a booking request and of a queued one (scheduling/api), read by the serializers below and only
# there. The container's are the agent's own (nodeagent/schema.py, DesiredContainer): a booking the agent
# would refuse to run is refused here, at booking.
_NAME_MAX = 120
_IMAGE_MAX = 512
_COMMAND_MAX = 256
_ARG_MAX = 4096
_ENV_MAX = 256
_ENV_NAME_MAX = 256
_ENV_VALUE_MAX = 8192
_GPU_COUNT_MAX = 4096
_WHOLE_SERVERS_MAX = 512
# 16 TiB: far beyond any GPU's memory, and within the column's integer range.
_MEMORY_MAX_MIB = 16 * 1024 * 1024
_REASON_MAX = 1000


class SpecSerializer(serializers.Serializer):
    """What to book: a GPU model or a minimum memory; a GPU count or a number of whole servers."""

    gpu_model = GpuModelField(required=False, allow_null=True, help_text="Catalog name, e.g. H100-80GB; any case.")
    min_memory_mib = serializers.IntegerField(min_value=1, max_value=_MEMORY_MAX_MIB, required=False, allow_null=True)
    gpu_count = serializers.IntegerField(min_value=1, max_value=_GPU_COUNT_MAX, required=False, allow_null=True)
    whole_servers = serializers.IntegerField(min_value=1, max_value=_WHOLE_SERVERS_MAX, required=False, allow_null=True)

    # The queue's searches (scheduling) do not cover slices: there a slice field is refused by name rather
    # than ignored, which would queue whole GPUs for a request that asked for slices.
    takes_slices = False

    def to_internal_value(self, data: Any) -> Any:
        if not self.takes_slices and isinstance(data, dict):
            errors = {
                name: ["The queue does not take MIG slices yet; book them with POST /api/v1/reservations/."]
                for name in ("mig_profile", "slices")
                if data.get(name) not in (None, False, "", "false")
            }
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors = {}
        if (attrs.get("gpu_model") is None) == (attrs.get("min_memory_mib") is None):
            errors["gpu_model"] = ["Give either a GPU model or a minimum GPU memory, not both or neither."]
        if (attrs.get("gpu_count") is None) == (attrs.get("whole_servers") is None):
            errors["gpu_count"] = ["Give either a GPU count or a number of whole servers, not both or neither."]
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class BookingSpecSerializer(SpecSerializer):
    """A booking's spec: also MIG slices, a profile and a count (docs/fractional.md, "Booking slices"), or a
    minimum memory that slices may meet (``slices``, "Slices by memory").

    Booking and the availability reads take slices; the queue takes the GPU specs alone (its search does
    not cover slices yet) and refuses a slice field by name."""

    takes_slices = True

    mig_profile = serializers.RegexField(
        MIG_PROFILE_RE.pattern,
        max_length=32,
        required=False,
        allow_null=True,
        help_text='Book MIG slices of this profile (e.g. "1g.10gb"): gpu_count of them, instead of a model or memory.',
        error_messages={"invalid": 'Not a MIG profile name; give one as nvidia-smi names it, e.g. "1g.10gb".'},
    )

    slices = StrictBooleanField(
        required=False,
        default=False,
        help_text="With min_memory_mib: each of gpu_count units may be a MIG slice with at least that memory, on "
        "the smallest MIG profile that has them free, else a whole GPU. The answer's spec says which was booked.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors = {}
        if attrs.get("slices"):
            if attrs.get("mig_profile") is not None:
                errors["slices"] = ["A MIG profile books slices already; give slices with a minimum memory instead."]
            elif attrs.get("min_memory_mib") is None or attrs.get("gpu_model") is not None:
                errors["slices"] = ["Slices are asked for by a minimum memory (spec.min_memory_mib), not a model."]
            if attrs.get("whole_servers") is not None:
                errors["whole_servers"] = ["Slices are booked by count (spec.gpu_count), not as whole servers."]
            elif attrs.get("gpu_count") is None:
                errors["gpu_count"] = ["Give the number of units to book."]
            if errors:
                raise serializers.ValidationError(errors)
            return attrs
        if attrs.get("mig_profile") is not None:
            if attrs.get("gpu_model") is not None or attrs.get("min_memory_mib") is not None:
                errors["mig_profile"] = [
                    "Give a MIG profile instead of a GPU model or a minimum memory, not with them."
                ]
            if attrs.get("whole_servers") is not None:
                errors["whole_servers"] = ["Slices are booked by count (spec.gpu_count), not as whole servers."]
            elif attrs.get("gpu_count") is None:
                errors["gpu_count"] = ["Give the number of slices to book."]
            if errors:
                raise serializers.ValidationError(errors)
            return attrs
        return super().validate(attrs)


def spec_from(data: dict[str, Any]) -> GpuSpec:
    model = data.get("gpu_model")
    return GpuSpec(
        gpu_model_id=model.pk if model else None,
        min_memory_mib=data.get("min_memory_mib"),
        gpu_count=data.get("gpu_count"),
        whole_servers=data.get("whole_servers"),
        mig_profile=data.get("mig_profile"),  # a BookingSpecSerializer's only
        slices=bool(data.get("slices")),
    )


# The one definition of a valid window in a booking request.
class WindowSerializer(serializers.Serializer):
    """When: `start`, and either `end` or `duration` (not both)."""

    start = StartField(help_text='ISO 8601 with a time zone, or "now": when the server reads the request.')
    end = AwareDateTimeField(required=False, help_text="The end (exclusive). Give end or duration, not both.")
    duration = DurationField(
        required=False,
        help_text='How long from start: "10m", "2h", "1d", "1h30m", an ISO 8601 duration ("PT10M"), or '
        "whole seconds (600). Give end or duration, not both.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs["end"] = _window_end(attrs)
        errors = {}
        if attrs["end"] <= attrs["start"]:
            errors["end"] = ["The window must end after it starts."]
        if attrs["start"] < timezone.now() - START_SKEW:
            errors["start"] = ['The window cannot start in the past; use "now" to start at once.']
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class WindowSerializerSchema(OpenApiSerializerExtension):
    """The schema says what validate() does: exactly one of ``end`` and ``duration``."""

    target_class = WindowSerializer

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["oneOf"] = [{"required": ["end"]}, {"required": ["duration"]}]
        return schema


def _window_end(attrs: dict[str, Any]) -> datetime:
    """The window's end: as given, or its start plus the duration; exactly one of the two."""
    end, duration = attrs.get("end"), attrs.pop("duration", None)
    if end is not None and duration is not None:
        both = "Give window.end or window.duration, not both."
        raise serializers.ValidationError({"end": [both], "duration": [both]})
    if end is not None:
        return end
    if duration is None:
        raise serializers.ValidationError({"end": ["Give window.end or window.duration."]})
    try:
        return attrs["start"] + duration
    except OverflowError:
        raise serializers.ValidationError({"duration": ["The window would end after the year 9999."]}) from None


class MountSerializer(serializers.Serializer):
    """One mount: a project volume or a dataset. The paths are judged by the booking (specs.mount_problems)."""

    volume = StrictStringField(max_length=63, required=False, help_text="A volume of the booking's project.")
    dataset = StrictStringField(max_length=63, required=False, help_text="A dataset the project may mount.")
    path = StrictStringField(
        max_length=4096,
        required=False,
        trim_whitespace=False,
        help_text="Where it appears in the container; default /workspace for a volume, /datasets/<name> for a dataset.",
    )
    # The metaclass takes declared fields off the class, so this does not shadow Field.read_only.
    read_only = StrictBooleanField(  # type: ignore[assignment]
        required=False, help_text="A volume's; a dataset is always read-only."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("volume" in attrs) == ("dataset" in attrs):
            raise serializers.ValidationError({"volume": ["Give either a volume or a dataset, not both or neither."]})
        return attrs


def mount_from(data: dict[str, Any]) -> MountRequest:
    kind = "volume" if "volume" in data else "dataset"
    return MountRequest(kind=kind, name=data[kind], path=data.get("path"), read_only=data.get("read_only"))


class SecretRequestSerializer(serializers.Serializer):
    """One project secret the container gets, by name (docs/images.md). The names and variables are judged by
    the booking (specs.secret_problems); whether the project has the secret, under its lock."""

    name = StrictStringField(max_length=63, trim_whitespace=False, help_text="A secret of the booking's project.")
    env = StrictStringField(
        max_length=255,
        required=False,
        allow_null=True,
        trim_whitespace=False,
        help_text="The variable it is set as. Neither env nor file: the variable of the secret's own name.",
    )
    file = StrictBooleanField(required=False, help_text="Also (or only) as the file /run/secrets/<name>, mode 0400.")


def secret_from(data: dict[str, Any]) -> SecretRequest:
    return SecretRequest.of(data["name"], data.get("env"), data.get("file"))


class PortSerializer(serializers.Serializer):
    """A named port the container serves (docs/proxy.md, "Named ports"). Types only here: the names, ports,
    paths and auths are judged by the booking (specs.port_problems), so a template's ports get the same words."""

    name = StrictStringField(max_length=64, trim_whitespace=False, help_text='What it serves, e.g. "jupyter".')
    port = serializers.IntegerField(help_text="The container's own TCP port (1-65535), on its loopback.")
    protocol = serializers.CharField(
        required=False, default="http", help_text=f"One of {', '.join(PORT_PROTOCOLS)}; only http opens in the browser."
    )
    path = StrictStringField(
        required=False, default="/", max_length=600, trim_whitespace=False, help_text="Where Open lands."
    )
    auth = serializers.CharField(
        required=False,
        default="none",
        help_text=f"One of {', '.join(PORT_AUTHS)}: jupyter gives the lab a token and opens it signed in.",
    )


def ports_field(help_text: str) -> serializers.ListField:
    """A list of named ports (a booking's ``container.ports``, a template's ``ports``); more than 16 is judged,
    with the rest, by specs.port_problems."""
    return serializers.ListField(
        child=PortSerializer(), required=False, default=list, max_length=64, help_text=help_text
    )


def port_from(data: dict[str, Any]) -> WebPort:
    return WebPort(
        name=data["name"], port=data["port"], protocol=data["protocol"], path=data["path"], auth=data["auth"]
    )


def ports_out(stored: list[dict[str, Any]] | None) -> list[dict[str, object]]:
    """A reservation's stored ports as answers give them: every key, older rows' defaults filled in."""
    return [port.stored() for port in ports_from_stored(list(stored or []))]


class ContainerSerializer(serializers.Serializer):
    image = serializers.CharField(
        max_length=_IMAGE_MAX,
        help_text="An image reference, [registry[:port]/]path[:tag][@sha256:digest], as docker pull takes it.",
    )
    command = serializers.ListField(
        child=StrictStringField(allow_blank=True, trim_whitespace=False, max_length=_ARG_MAX),
        required=False,
        default=list,
        max_length=_COMMAND_MAX,
    )
    env = EnvField(
        child=StrictStringField(allow_blank=True, trim_whitespace=False, max_length=_ENV_VALUE_MAX),
        max_items=_ENV_MAX,
        name_max=_ENV_NAME_MAX,
        required=False,
        default=dict,
    )
    volumes = serializers.ListField(child=MountSerializer(), required=False, default=list, max_length=MAX_VOLUMES)
    network = serializers.ChoiceField(
        choices=NetworkMode.choices,
        default=NetworkMode.NONE,
        help_text='"egress": the Docker network an operator allows the project; "none": loopback only.',
    )
    secrets = serializers.ListField(
        child=SecretRequestSerializer(),
        required=False,
        default=list,
        max_length=MAX_SECRETS,
        help_text="Project secrets the container gets, as variables or files; values never appear in an answer.",
    )
    ports = ports_field("Named web ports the proxy opens in the browser (docs/proxy.md), e.g. jupyter on 8888.")


def container_from(data: dict[str, Any]) -> ContainerSpec:
    return ContainerSpec(
        image=data["image"],
        command=data["command"],
        env=data["env"],
        volumes=[mount_from(m) for m in data["volumes"]],
        network=data["network"],
        secrets=[secret_from(x) for x in data.get("secrets", [])],
        ports=[port_from(x) for x in data.get("ports", [])],
    )


# What a booking and a queued request (scheduling/api) both start with: the project and a name.
class ProjectWorkSerializer(serializers.Serializer):
    project = SlugRelatedField(
        slug_field="slug",
        queryset=Project.objects.none(),
        help_text="The project's slug; you must be its owner or a member.",
    )
    name = serializers.CharField(max_length=_NAME_MAX)

    def __init__(self, *args: Any, projects: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if projects is not None:
            # Only projects the caller can see: another tenant's slug reads as "does not exist".
            self.fields["project"].queryset = projects  # type: ignore[attr-defined]


# The one definition of a valid booking request: every rule and every error's wording is here, in the
# serializers and fields it holds. POST /reservations reads each body with ``read_booking`` (below). No
# docstring: it would become the schema's description of the request.
class ReservationCreateSerializer(ProjectWorkSerializer):
    spec = BookingSpecSerializer()
    window = WindowSerializer()
    container = ContainerSerializer()
    # Written out into the body before this serializer reads it (templates app, docs/templates.md): declared
    # for the schema's sake, never read here.
    template = serializers.CharField(
        max_length=63,
        required=False,
        help_text="A launch template's name: its container, spec and window length fill what the request leaves "
        "out (spec and container keys given override the template's; a window with only a start lasts the "
        "template's length).",
    )

    def to_domain(self) -> dict[str, Any]:
        data = self.validated_data
        return {
            "project": data["project"],
            "name": data["name"],
            "spec": spec_from(data["spec"]),
            "window": Window(data["window"]["start"], data["window"]["end"]),
            "container": container_from(data["container"]),
        }

    def prepare(
        self, data: Any, *, projects: QuerySet[Project] | None, project: Project | None, gpu_model: GpuModel | None
    ) -> None:
        """Makes this serializer read ``data`` afresh: what is kept from an earlier read is dropped (DRF keeps
        its results in these three attributes) and every value one request gives is set anew."""
        self.initial_data = data
        for cached in ("_validated_data", "_errors", "_data"):
            self.__dict__.pop(cached, None)
        fields = self.fields
        fields["project"].queryset = _NO_PROJECTS if projects is None else projects  # type: ignore[attr-defined]
        fields["project"].known = {} if project is None else {project.slug: project}  # type: ignore[attr-defined]
        spec = fields["spec"].fields  # type: ignore[attr-defined]
        spec["gpu_model"].known = {} if gpu_model is None else {gpu_model.name: gpu_model}


# Each thread's booking serializer, built once (see read_booking).
_prepared = threading.local()
_NO_PROJECTS = Project.objects.none()


def read_booking(
    data: Any,
    *,
    projects: QuerySet[Project] | None = None,
    project: Project | None = None,
    gpu_model: GpuModel | None = None,
) -> dict[str, Any]:
    """A booking request read by ReservationCreateSerializer, as ``services.reservation_create``'s keyword
    arguments (``actor`` aside); its ValidationError otherwise, with every field name and wording.

    ``project`` and ``gpu_model``: what the view has already read for the slug and the model name the body
    gives, so that they are not read again; ``projects``: those the caller may book in, for a slug not
    already read (without them, such a slug "does not exist").

    POST /reservations runs for every booking an automation makes, and a serializer's fields are deep copies
    of the declared ones, made anew for each instance and each nested serializer: building them cost more
    than reading the request, and more than the booking's own SQL. So each thread builds one
    ReservationCreateSerializer, once, and reads every booking with it; ``prepare`` sets all that one request
    gives on every call, so nothing of one request is left for the next.
    """
    serializer: ReservationCreateSerializer | None = getattr(_prepared, "booking", None)
    if serializer is None:
        serializer = _prepared.booking = ReservationCreateSerializer()
    serializer.prepare(data, projects=projects, project=project, gpu_model=gpu_model)
    serializer.is_valid(raise_exception=True)
    return serializer.to_domain()


class ReservationReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=_REASON_MAX, required=False, allow_blank=True, default="")


class ExtendWindowSerializer(serializers.Serializer):
    end = AwareDateTimeField(help_text="The new end; later than the current one.")


class ExtendSerializer(ReservationReasonSerializer):
    """The new end, as `ends_at` or in the booking's own form, `{"window": {"end": ...}}`; one of them."""

    ends_at = AwareDateTimeField(required=False, help_text="The new end; later than the current one.")
    window = ExtendWindowSerializer(required=False, help_text='The same, as a booking gives it: {"end": ...}.')

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        window = attrs.pop("window", None)
        if window is not None and "ends_at" in attrs:
            raise serializers.ValidationError({"ends_at": ["Give ends_at or window.end, not both."]})
        if window is not None:
            attrs["ends_at"] = window["end"]
        if "ends_at" not in attrs:
            raise serializers.ValidationError({"ends_at": ["The new end is required: ends_at or window.end."]})
        return attrs


class ExtendQuoteQuerySerializer(serializers.Serializer):
    ends_at = AwareDateTimeField(help_text="The new end to price; later than the current one.")


class ExtendRefusalSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="What POST .../extend/ would answer: gpu_taken, quota_exceeded, ...")
    message = serializers.CharField()
    free_until = serializers.DateTimeField(
        required=False, help_text="With gpu_taken: when the next booking of one of its GPUs starts."
    )


WARNINGS_HELP = (
    "What the booking or extension was told and let through: a budget past its cap whose action is warn "
    "(code budget_exceeded, message, budget, spent, needed, available, period); an image the registry could not "
    "be asked about (code image_not_checked, message, image, registry)."
)


class ExtendQuoteSerializer(serializers.Serializer):
    """What extending to ``ends_at`` costs and whether POST .../extend/ would accept it now."""

    ends_at = serializers.DateTimeField()
    current_ends_at = serializers.DateTimeField()
    extra_hours = serializers.DecimalField(max_digits=20, decimal_places=6)
    credits_per_hour = serializers.DecimalField(max_digits=20, decimal_places=4)
    extra_credits = serializers.DecimalField(max_digits=20, decimal_places=4, help_text="The credits it would hold.")
    allowed = serializers.BooleanField(help_text="True when the extension would be accepted now.")
    gpus_free = serializers.BooleanField(help_text="False when one of its GPUs is booked or unavailable then.")
    refusal = ExtendRefusalSerializer(allow_null=True, help_text="Why not, when not allowed; else null.")
    warnings = serializers.ListField(
        child=serializers.DictField(), help_text=WARNINGS_HELP + " What POST .../extend/ would answer now."
    )


class SpecOutSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(source="gpu_model.name", allow_null=True, default=None)
    min_memory_mib = serializers.IntegerField(allow_null=True)
    gpu_count = serializers.IntegerField(allow_null=True)
    whole_servers = serializers.IntegerField(allow_null=True)
    mig_profile = serializers.SerializerMethodField(help_text="The MIG profile of a slice booking; else null.")

    def get_mig_profile(self, reservation: Reservation) -> str | None:
        return reservation.mig_profile or None


class SecretOutSerializer(serializers.Serializer):
    name = serializers.CharField()
    env = serializers.CharField(allow_null=True)
    file = serializers.BooleanField()


class MountOutSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["volume", "dataset"])
    name = serializers.CharField()
    path = serializers.CharField()
    read_only = serializers.BooleanField()  # type: ignore[assignment]  # a field named like Field.read_only


class CostSerializer(serializers.Serializer):
    """What the reservation costs (docs/api.md, "Cost"); credits are decimal strings."""

    credits_per_hour = serializers.DecimalField(
        max_digits=20,
        decimal_places=4,
        coerce_to_string=True,
        help_text="The billing weights of its GPUs, summed, times credit_multiplier.",
    )
    credit_multiplier = serializers.DecimalField(
        max_digits=6,
        decimal_places=3,
        help_text="Its class's price factor, set at booking: 1.5 for high, 1 for normal and advance bookings, "
        "0.5 for preemptible.",
    )
    booked_credits = serializers.DecimalField(
        max_digits=20, decimal_places=4, help_text="What the whole window as booked now costs."
    )
    elapsed_seconds = serializers.IntegerField(
        help_text="How long its GPUs have been held: 0 before the window, up to now during it, its length after."
    )
    gpu_hours = serializers.DecimalField(max_digits=20, decimal_places=4, help_text="GPU-hours held so far.")
    credits_so_far = serializers.DecimalField(
        max_digits=20, decimal_places=4, help_text="The credits those GPU-hours cost, rounded up."
    )
    credits_charged = serializers.DecimalField(
        max_digits=20,
        decimal_places=4,
        allow_null=True,
        help_text="What the ledger charged, once it ended (completed, cancelled, failed, interrupted); else null.",
    )


class PortOutSerializer(serializers.Serializer):
    name = serializers.CharField()
    port = serializers.IntegerField()
    protocol = serializers.CharField()
    path = serializers.CharField()
    auth = serializers.CharField()


class ReservationSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    ports = serializers.SerializerMethodField()
    volumes = MountOutSerializer(many=True, read_only=True, help_text="The mounts as resolved at booking.")
    secrets = SecretOutSerializer(
        many=True, read_only=True, help_text="The project secrets it gets, by name (values are never shown)."
    )
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)
    spec = SpecOutSerializer(source="*", read_only=True)
    cost = serializers.SerializerMethodField()
    template = serializers.SerializerMethodField()
    credit_multiplier = serializers.DecimalField(max_digits=6, decimal_places=3, read_only=True)
    preempted_by = serializers.UUIDField(
        source="preempted_by.public_id",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The reservation that preempted this one (cut its window short), or null.",
    )

    class Meta:
        model = Reservation
        fields = [
            "id",
            "project",
            "name",
            "state",
            "spec",
            "starts_at",
            "ends_at",
            "image",
            "command",
            "env",
            "volumes",
            "network",
            "secrets",
            "ports",
            "created_by",
            "created_at",
            "updated_at",
            "cost",
            "preemptible",
            "notice_seconds",
            "credit_multiplier",
            "preempted_by",
            "template",
        ]
        read_only_fields = fields

    @extend_schema_field(PortOutSerializer(many=True, help_text="The named ports it declared (docs/proxy.md)."))
    def get_ports(self, reservation: Reservation) -> list[dict[str, object]]:
        return ports_out(reservation.ports)

    @extend_schema_field(serializers.CharField(allow_null=True, help_text="The launch template it was booked from."))
    def get_template(self, reservation: Reservation) -> str | None:
        return reservation.template or None

    @extend_schema_field(CostSerializer)
    def get_cost(self, reservation: Reservation) -> dict[str, Any]:
        return cost_for(reservation)


class AllocationSerializer(serializers.ModelSerializer):
    gpu = serializers.CharField(source="gpu.uuid")
    server = serializers.CharField(source="gpu.server.hostname")
    index = serializers.IntegerField(source="gpu.index")
    gpu_model = serializers.CharField(source="gpu.model.name")
    mig_device = serializers.CharField(
        source="mig_device.uuid",
        allow_null=True,
        default=None,
        help_text="The MIG device's uuid for a slice; else null.",
    )
    slices = serializers.SerializerMethodField(help_text="The GPU's memory slices held, [start, end): [0, 8) whole.")

    class Meta:
        model = Allocation
        fields = [
            "gpu",
            "server",
            "index",
            "gpu_model",
            "mig_device",
            "slices",
            "starts_at",
            "ends_at",
            "active",
            "released_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField(), min_length=2, max_length=2))
    def get_slices(self, allocation: Allocation) -> list[int]:
        return [allocation.slice_start, allocation.slice_end]


class ReservationEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReservationEvent
        fields = ["from_state", "to_state", "actor_label", "reason", "data", "at"]
        read_only_fields = fields


class SshAccessSerializer(serializers.Serializer):
    server = serializers.CharField()
    host = serializers.CharField(help_text="The gateway's address, as its agent reports it.")
    port = serializers.IntegerField()
    user = serializers.CharField(help_text="The reservation's id: the gateway's user name for it.")
    command = serializers.CharField(help_text="The exact ssh command.")
    known_hosts = serializers.CharField(help_text="The gateway's host key as a known_hosts line.")


class WebAccessSerializer(PortOutSerializer):
    url = serializers.CharField(help_text="The app's stable address; POST .../open/ for a link that signs in.")


class AccessSerializer(serializers.Serializer):
    """How to reach a running reservation (docs/access.md, "Connect")."""

    ready = serializers.BooleanField(help_text="True when SSH sessions are accepted now.")
    message = serializers.CharField(help_text="Why not, when not ready; empty otherwise.")
    ssh = SshAccessSerializer(many=True, help_text="One entry per server the reservation runs on.")
    web = WebAccessSerializer(
        many=True, required=False, help_text="Its http ports the web proxy opens now (docs/proxy.md); empty otherwise."
    )
    terminal = serializers.BooleanField(required=False, help_text="True when a web terminal can be opened now.")


class UlimitOutSerializer(serializers.Serializer):
    name = serializers.CharField()
    soft = serializers.IntegerField(help_text="-1: unlimited.")
    hard = serializers.IntegerField(help_text="-1: unlimited.")


class ContainerShareSerializer(serializers.Serializer):
    """What the container gets on one server besides its GPUs (docs/reservations.md, "Resources")."""

    server = serializers.CharField()
    gpu_share = serializers.FloatField(help_text="The share of the server's GPUs held there (MIG slices in part).")
    cpus = serializers.IntegerField(allow_null=True, help_text="CPU cores it is pinned to; null: not limited.")
    memory_mib = serializers.IntegerField(allow_null=True, help_text="Its host memory limit; null: not limited.")
    shm_mib = serializers.IntegerField(help_text="The size of its /dev/shm.")
    ulimits = UlimitOutSerializer(many=True)
    notes = serializers.ListField(child=serializers.CharField(), help_text="Why a limit is not set, if one is not.")


class ReservationDetailSerializer(ReservationSerializer):
    allocations = AllocationSerializer(many=True, read_only=True)
    events = ReservationEventSerializer(many=True, read_only=True)
    access = serializers.SerializerMethodField()
    warnings = serializers.SerializerMethodField(help_text=WARNINGS_HELP + " Empty on a later read.")
    container_resources = serializers.SerializerMethodField(
        help_text="Per server, the CPUs, host memory, /dev/shm and ulimits its container gets by the operator's policy."
    )

    class Meta(ReservationSerializer.Meta):
        fields = [
            *ReservationSerializer.Meta.fields,
            "allocations",
            "events",
            "access",
            "warnings",
            "container_resources",
        ]
        read_only_fields = fields

    @extend_schema_field(ContainerShareSerializer(many=True))
    def get_container_resources(self, reservation: Reservation) -> list[dict[str, Any]]:
        return resources.for_reservation(reservation)

    @extend_schema_field(AccessSerializer)
    def get_access(self, reservation: Reservation) -> dict[str, Any]:
        return hooks.access_for(reservation)

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_warnings(self, reservation: Reservation) -> list[dict[str, Any]]:
        return list(getattr(reservation, "warnings", []))


# --- The booking's answer ----------------------------------------------------------------------------------
# POST /reservations answers every booking an automation makes; ``reservation_detail`` builds the answer
# directly, giving what ReservationDetailSerializer gives (a test compares them).

_AT = serializers.DateTimeField()
_DECIMAL3 = serializers.DecimalField(max_digits=6, decimal_places=3)


def _preempted_by(reservation: Reservation) -> str | None:
    winner = reservation.preempted_by if reservation.preempted_by_id is not None else None
    return None if winner is None else str(winner.public_id)


def _at(value: datetime | None) -> str | None:
    return _AT.to_representation(value) if value else None


def reservation_detail(reservation: Reservation) -> dict[str, Any]:
    """ReservationDetailSerializer(reservation).data, built directly (its allocations and events as loaded)."""
    model = reservation.gpu_model
    creator = reservation.created_by
    return {
        "id": str(reservation.public_id),
        "project": reservation.project.slug,
        "name": str(reservation.name),
        "state": str(reservation.state),
        "spec": {
            "gpu_model": None if model is None else str(model.name),
            "min_memory_mib": reservation.min_memory_mib,
            "gpu_count": reservation.gpu_count,
            "whole_servers": reservation.whole_servers,
            "mig_profile": reservation.mig_profile or None,
        },
        "starts_at": _at(reservation.starts_at),
        "ends_at": _at(reservation.ends_at),
        "image": str(reservation.image),
        "command": reservation.command,
        "env": reservation.env,
        "volumes": reservation.volumes,
        "network": str(reservation.network),
        "secrets": reservation.secrets,
        "ports": ports_out(reservation.ports),
        "created_by": None if creator is None else str(creator.username),
        "created_at": _at(reservation.created_at),
        "updated_at": _at(reservation.updated_at),
        "cost": cost_for(reservation),
        "preemptible": bool(reservation.preemptible),
        "notice_seconds": int(reservation.notice_seconds),
        "credit_multiplier": _DECIMAL3.to_representation(reservation.credit_multiplier),
        "preempted_by": _preempted_by(reservation),
        "template": reservation.template or None,
        "allocations": [
            {
                "gpu": str(a.gpu.uuid),
                "server": str(a.gpu.server.hostname),
                "index": int(a.gpu.index),
                "gpu_model": str(a.gpu.model.name),
                "mig_device": None if a.mig_device is None else str(a.mig_device.uuid),
                "slices": [int(a.slice_start), int(a.slice_end)],
                "starts_at": _at(a.starts_at),
                "ends_at": _at(a.ends_at),
                "active": bool(a.active),
                "released_at": _at(a.released_at),
            }
            for a in reservation.allocations.all()
        ],
        "events": [
            {
                "from_state": str(e.from_state),
                "to_state": str(e.to_state),
                "actor_label": str(e.actor_label),
                "reason": str(e.reason),
                "data": e.data,
                "at": _at(e.at),
            }
            for e in reservation.events.all()
        ],
        "access": hooks.access_for(reservation),
        "warnings": list(getattr(reservation, "warnings", [])),
        "container_resources": resources.for_reservation(reservation),
    }
