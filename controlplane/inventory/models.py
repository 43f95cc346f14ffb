from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from controlplane.inventory.choices import EventKind, GpuHealth, MigChange, ServerState, Vendor

# A site's power usage effectiveness when none is given: a typical air-cooled data centre (liquid cooling is
# nearer 1.1 to 1.2). Facility energy is GPU energy x PUE (docs/efficiency.md).
DEFAULT_PUE = Decimal("1.50")
# Thermal design power of common GPU models by NVML product name fragment, for a catalog entry that does not
# give ``tdp_watts``: the most a GPU of that model draws by design (SXM variants where a model has two).
KNOWN_TDP_WATTS = (
    ("H200", 700),
    ("H100 PCIe", 350),
    ("H100", 700),
    ("A100-PCIE", 250),
    ("A100 PCIe", 250),
    ("A100", 400),
    ("L40S", 350),
    ("L40", 300),
    ("L4", 72),
    ("A10", 150),
    ("V100", 300),
    ("T4", 70),
)


class Site(models.Model):
    name = models.CharField(max_length=100, unique=True)
    location = models.CharField(max_length=200, blank=True)
    pue = models.DecimalField(
        max_digits=4,
        decimal_places=2,
        default=DEFAULT_PUE,
        validators=[MinValueValidator(Decimal("1.00")), MaxValueValidator(Decimal("5.00"))],
        help_text="Power usage effectiveness: facility energy / IT energy (1.2 liquid cooled, 1.6 air).",
    )
    electricity_price_per_kwh = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text="What a kWh of facility energy costs, in ENERGY_CURRENCY.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Rack(models.Model):
    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="racks")
    name = models.CharField(max_length=100)

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "name"], name="rack_unique_name_per_site")]

    def __str__(self) -> str:
        return f"{self.site}/{self.name}"


class GpuModel(models.Model):
    """The catalog: what a GPU model is, what an hour of it costs and how many credits it weighs."""

    name = models.CharField(max_length=64, unique=True, help_text="Short catalog name, e.g. H100-80GB.")
    # What NVML calls it ("NVIDIA H100 80GB HBM3"); discovery maps reported GPUs to the catalog by this.
    product_name = models.CharField(max_length=128, unique=True)
    memory_mib = models.PositiveIntegerField()
    vendor = models.CharField(max_length=16, choices=Vendor.choices, default=Vendor.NVIDIA)
    price_per_gpu_hour = models.DecimalField(
        max_digits=10, decimal_places=4, default=Decimal("0"), validators=[MinValueValidator(Decimal("0"))]
    )
    currency = models.CharField(max_length=3, default="USD")
    billing_weight = models.DecimalField(
        max_digits=8,
        decimal_places=4,
        default=Decimal("1"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Credits charged per GPU-hour.",
    )
    tdp_watts = models.PositiveIntegerField(
        null=True, blank=True, help_text="Thermal design power; null: from the known models' table, if listed."
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def rated_watts(self) -> int | None:
        """``tdp_watts``, else the known table's figure for this product, else None (unknown)."""
        if self.tdp_watts is not None:
            return self.tdp_watts
        return known_tdp_watts(self.product_name or self.name)


# A GPU has eight memory slices (docs/fractional.md, "Profiles"): a whole-GPU allocation covers all of them, and
# a MIG profile's share of the GPU is its memory slices out of these.
GPU_MEMORY_SLICES = 8


def slice_weight(model_weight: Decimal, memory_slices: int, override: Decimal | None = None) -> Decimal:
    """The billing weight of one MIG slice: the catalog profile's override where an operator set one, else its
    GPU model's weight times its share of the GPU's memory slices (``memory_slices / 8``)."""
    if override is not None:
        return Decimal(override)
    return Decimal(model_weight) * Decimal(memory_slices) / GPU_MEMORY_SLICES


class GpuModelMigProfile(models.Model):
    """A MIG profile of a catalog GPU model: what a slice of it is, and what it weighs when rented.

    ``billing_weight`` null (the default) means the profile's fraction of the GPU (``slice_weight``); a value
    replaces that fraction for every slice of this profile on GPUs of this model."""

    gpu_model = models.ForeignKey(GpuModel, on_delete=models.CASCADE, related_name="mig_profiles")
    name = models.CharField(max_length=32, help_text='As nvidia-smi names it, e.g. "1g.10gb".')
    memory_mib = models.PositiveIntegerField()
    compute_slices = models.PositiveSmallIntegerField()
    memory_slices = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(GPU_MEMORY_SLICES)]
    )
    billing_weight = models.DecimalField(
        max_digits=8,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Credits per hour of one slice; null: the GPU model's weight x memory slices / 8.",
    )

    class Meta:
        ordering = ["gpu_model__name", "memory_slices", "compute_slices", "name"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_model", "name"], name="mig_profile_unique_name_per_model"),
            models.CheckConstraint(
                condition=models.Q(memory_slices__gte=1, memory_slices__lte=GPU_MEMORY_SLICES),
                name="mig_profile_memory_slices_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model_id}: {self.name}"

    @property
    def effective_weight(self) -> Decimal:
        return slice_weight(self.gpu_model.billing_weight, self.memory_slices, self.billing_weight)

    @property
    def price_per_hour(self) -> Decimal:
        """The model's price scaled as the weight is: what the usage records' cost of an hour of it is."""
        return price_for_weight(self.gpu_model, self.effective_weight, self.memory_slices)


def price_for_weight(model: GpuModel, weight: Decimal, memory_slices: int) -> Decimal:
    """The price of an hour of a unit of ``weight`` credits on ``model``: its price per GPU-hour times
    ``weight`` over the model's weight (a model of weight 0 charges nothing in credits: then by memory share)."""
    if model.billing_weight > 0:
        return Decimal(model.price_per_gpu_hour) * Decimal(weight) / Decimal(model.billing_weight)
    return Decimal(model.price_per_gpu_hour) * Decimal(memory_slices) / GPU_MEMORY_SLICES


def mig_weight_override(model: GpuModel, profile: str) -> Decimal | None:
    """The operator's weight for ``profile`` on ``model``, or None. Reads ``model.mig_profiles`` (prefetch it
    where many allocations are priced), once per model instance."""
    cached: dict[str, Decimal | None] | None = getattr(model, "_mig_overrides", None)
    if cached is None:
        cached = {p.name: p.billing_weight for p in model.mig_profiles.all()}
        model._mig_overrides = cached  # type: ignore[attr-defined]
    return cached.get(profile)


def known_tdp_watts(product_name: str) -> int | None:
    for fragment, watts in KNOWN_TDP_WATTS:
        if fragment.lower() in product_name.lower():
            return watts
    return None


class Server(models.Model):
    """A bare-metal GPU server with a lifecycle; its agent keeps the facts below true."""

    hostname = models.CharField(max_length=253, unique=True)
    rack = models.ForeignKey(Rack, on_delete=models.SET_NULL, null=True, blank=True, related_name="servers")
    state = models.CharField(max_length=16, choices=ServerState.choices, default=ServerState.COMMISSIONING)
    # Where an offline server goes back to when its heartbeats return.
    state_before_offline = models.CharField(max_length=16, choices=ServerState.choices, blank=True)
    simulated = models.BooleanField(default=False, help_text="Its GPUs come from the simulated backend.")
    agent_version = models.CharField(max_length=32, blank=True)
    facts = models.JSONField(default=dict, blank=True)
    heartbeat_interval_s = models.FloatField(default=5.0)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_seq = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    rated_power_w = models.PositiveIntegerField(
        null=True, blank=True, help_text="The most the server's GPUs draw by design; null: the sum of their TDPs."
    )

    class Meta:
        ordering = ["hostname"]
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return self.hostname


class Gpu(models.Model):
    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="gpus")
    uuid = models.CharField(max_length=64, unique=True)
    index = models.PositiveSmallIntegerField()
    model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="gpus")
    product_name = models.CharField(max_length=128)
    memory_mib = models.PositiveIntegerField()
    pci_bus_id = models.CharField(max_length=32, blank=True)
    numa_node = models.SmallIntegerField(null=True, blank=True)
    nvlink_peers = models.JSONField(default=list, blank=True, help_text="UUIDs of GPUs linked by NVLink.")
    present = models.BooleanField(default=True, help_text="False when the agent stopped reporting it.")
    health = models.CharField(max_length=16, choices=GpuHealth.choices, default=GpuHealth.HEALTHY)
    health_reasons = models.JSONField(default=list, blank=True)
    # Hardware faults (double-bit ECC, row-remap failure, fatal XID) stay until an operator acknowledges.
    needs_acknowledgement = models.BooleanField(default=False)
    telemetry = models.JSONField(default=dict, blank=True, help_text="Latest sample, DCGM field names.")
    telemetry_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    vendor = models.CharField(max_length=16, choices=Vendor.choices, default=Vendor.NVIDIA)
    # The MIG state as the agent last reported it (nodeagent.schema.MigState as JSON); null: the GPU cannot do
    # MIG. Kept whole on the row so the heartbeat compares it without a statement; MigDevice rows follow it.
    mig = models.JSONField(null=True, blank=True)
    # An operator's reconfiguration: the layout asked for ({"enabled": bool, "layout": [...]}), its number
    # (sent to the agent, which answers naming it) and where it stands.
    mig_desired = models.JSONField(null=True, blank=True)
    mig_generation = models.PositiveIntegerField(default=0)
    mig_change = models.CharField(max_length=16, choices=MigChange.choices, default=MigChange.NONE, blank=True)

    class Meta:
        ordering = ["server__hostname", "index"]
        constraints = [
            # Only among present GPUs: a replacement card takes the index of the one that went missing.
            models.UniqueConstraint(
                fields=["server", "index"], condition=models.Q(present=True), name="gpu_unique_index_per_server"
            ),
        ]
        indexes = [models.Index(fields=["model", "health"])]

    def __str__(self) -> str:
        return f"{self.server.hostname}:{self.index} ({self.uuid})"


class MigDeviceQuerySet(models.QuerySet["MigDevice"]):
    def present(self) -> MigDeviceQuerySet:
        """The devices the GPU has now: what placement, availability and the fleet API look at."""
        return self.filter(present=True)


class MigDevice(models.Model):
    """A MIG device of a GPU (a compute instance in a GPU instance): the unit a slice booking rents.

    Rows follow the agent's reports, keyed by the device's uuid, which is what a container is given: a device
    no longer reported is marked gone (``present`` false, ``gone_at``), never deleted, since allocations of the
    past name it; one reported again under its uuid comes back. Recreated instances get new uuids from the
    driver, so a new uuid is a new device, even where an old one sat."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="mig_devices")
    uuid = models.CharField(max_length=64, unique=True)
    profile = models.CharField(max_length=32, blank=True, help_text='As nvidia-smi names it, e.g. "3g.40gb".')
    profile_id = models.PositiveSmallIntegerField(null=True, blank=True)
    gpu_instance_id = models.PositiveSmallIntegerField(null=True, blank=True)
    compute_instance_id = models.PositiveSmallIntegerField(null=True, blank=True)
    memory_mib = models.PositiveIntegerField(null=True, blank=True)
    compute_slices = models.PositiveSmallIntegerField(null=True, blank=True)
    memory_slices = models.PositiveSmallIntegerField(null=True, blank=True)
    # The first of the GPU's eight memory slices it covers: with memory_slices, the span a booking excludes.
    placement_start = models.PositiveSmallIntegerField(null=True, blank=True)
    present = models.BooleanField(default=True, help_text="False once its agent stopped reporting it.")
    gone_at = models.DateTimeField(null=True, blank=True, help_text="When its agent stopped reporting it.")

    objects = MigDeviceQuerySet.as_manager()

    class Meta:
        ordering = ["gpu", "placement_start", "uuid"]

    def __str__(self) -> str:
        return f"{self.gpu}: MIG {self.profile or '?'} ({self.uuid})"


class ServerEvent(models.Model):
    """The audit trail of a server and its GPUs: who changed what, when, and why."""

    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="events")
    gpu = models.ForeignKey(Gpu, on_delete=models.SET_NULL, null=True, blank=True, related_name="events")
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    # "system:node-loss", "agent:<hostname>", or the user's name: readable after the user is deleted.
    actor_label = models.CharField(max_length=150)
    reason = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.server}: {self.kind} {self.from_state}->{self.to_state}"
