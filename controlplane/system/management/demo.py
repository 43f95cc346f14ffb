"""The demo data that ``runsystem`` and ``seeddemo`` create: an operator, a tenant, a catalog.

Every step is idempotent: a second run finds what the first made and changes nothing an operator may have
edited since (prices, passwords), so restarting the demo never undoes someone's work.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

if TYPE_CHECKING:
    from controlplane.accounts.models import Project

OPERATOR_USERNAME = "operator"
TENANT_USERNAME = "alice"
DEMO_PROJECT_SLUG = "demo"

# name, what NVML (or amdsmi) reports, memory in MiB, list price per GPU-hour, credits per GPU-hour.
GPU_CATALOG: tuple[tuple[str, str, int, Decimal, Decimal], ...] = (
    ("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, Decimal("2.4900"), Decimal("1.0000")),
    ("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, Decimal("1.7900"), Decimal("0.7500")),
    ("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, Decimal("1.2900"), Decimal("0.5000")),
    ("MI300X", "AMD Instinct MI300X", 196592, Decimal("2.2900"), Decimal("1.0000")),
    # One of an MI250X's two dies: amdsmi lists each as its own GPU.
    ("MI250X", "AMD Instinct MI250X", 65536, Decimal("0.9900"), Decimal("0.4000")),
)

# The tenant's limits: enough to book a whole H100 server for a day, not the whole fleet.
DEMO_MAX_CONCURRENT_GPUS = 8
DEMO_CREDITS_PER_PERIOD = Decimal("1000")
DEMO_MAX_RESERVATION_HOURS = Decimal("72")


@dataclass
class Login:
    username: str
    password: str | None  # None: the account existed with a password this run does not know
    role: str


@dataclass
class DemoResult:
    logins: list[Login] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _logins_file() -> Path:
    return Path(settings.VAR_DIR) / "demo-logins.json"


def _remembered_passwords() -> dict[str, str]:
    try:
        return json.loads(_logins_file().read_text())
    except (OSError, ValueError):
        return {}


def _remember_password(username: str, password: str) -> None:
    # Kept beside the development secret key so the banner can show the login again on the next start.
    known = _remembered_passwords()
    known[username] = password
    path = _logins_file()
    path.write_text(json.dumps(known, indent=2))
    path.chmod(0o600)


def _ensure_user(*, username: str, env_var: str, staff: bool) -> tuple[Any, str | None]:
    """Create the user once; a password from ``env_var`` is (re)applied on every run."""
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(
        username=username, defaults={"email": f"{username}@example.test", "is_staff": staff, "is_superuser": staff}
    )
    wanted = os.environ.get(env_var) or None
    if created or wanted:
        password = wanted or secrets.token_urlsafe(12)
        user.set_password(password)
        user.save(update_fields=["password"])
        _remember_password(username, password)
        return user, password
    remembered = _remembered_passwords().get(username)
    # Someone changed it through the admin since: do not show a stale password.
    if remembered and user.check_password(remembered):
        return user, remembered
    return user, None


def seed_catalog() -> list[str]:
    """Create the GPU models the simulated fleet reports, with the MIG profiles of NVIDIA's tables (the ones the
    simulated backend and layout checks use, ``nodeagent.mig.PROFILES``) at the default weight; never overwrite
    prices or weights an operator changed."""
    from controlplane.fleet.mig import vendor_of
    from controlplane.inventory.models import GpuModel
    from controlplane.inventory.services import mig_profiles_add
    from nodeagent.mig import PROFILES

    created = []
    for name, product_name, memory_mib, price, weight in GPU_CATALOG:
        model, was_created = GpuModel.objects.get_or_create(
            name=name,
            defaults={
                "product_name": product_name,
                "memory_mib": memory_mib,
                "vendor": vendor_of(product_name),
                "price_per_gpu_hour": price,
                "billing_weight": weight,
            },
        )
        if was_created:
            created.append(name)
        table = PROFILES.get(name, {})
        mig_profiles_add(
            model=model,
            profiles=[(p.name, p.memory_mib, p.compute_slices, p.memory_slices) for p in table.values()],
        )
    return created


def _seed_ledger(*, project: Project, actor: Any) -> str:
    """Give the demo project a quota policy and this period's credits through the ledger's own services."""
    try:
        from controlplane.ledger import services as ledger
        from controlplane.ledger.models import QuotaPolicy
    except ImportError as exc:
        return f"ledger unavailable ({exc}): the demo project has no quota policy or credits"
    if not QuotaPolicy.objects.filter(project=project).exists():
        # Only when missing: an operator's later change to the policy survives a restart of the demo.
        ledger.quota_policy_set(
            project=project,
            actor=actor,
            credits_per_period=DEMO_CREDITS_PER_PERIOD,
            max_concurrent_gpus=DEMO_MAX_CONCURRENT_GPUS,
            max_reservation_hours=DEMO_MAX_RESERVATION_HOURS,
        )
    # Granted once per period (the ledger's own unique key makes a repeat a no-op).
    granted = ledger.ledger_grant_period(project=project)
    if granted is not None:
        return f"project {DEMO_PROJECT_SLUG}: quota policy set, granted {granted.amount} credits for this period"
    return f"project {DEMO_PROJECT_SLUG}: quota policy and this period's credits already in place"


def _seed_queue_classes(*, project: Project) -> str:
    """Grant the restricted "high" queue class to the demo project's quota policy (docs/scheduling.md)."""
    try:
        from controlplane.ledger.models import QuotaPolicy
        from controlplane.scheduling.models import PriorityClass
    except ImportError as exc:
        return f"scheduling unavailable ({exc}): no queue classes granted"
    high = PriorityClass.objects.filter(name="high").first()
    policy = QuotaPolicy.objects.filter(project=project).first()
    if high is None or policy is None:
        return f"project {DEMO_PROJECT_SLUG}: no quota policy or no class high, so no class granted"
    high.allowed_policies.add(policy)
    return f"project {DEMO_PROJECT_SLUG}: may queue in the restricted class high"


@transaction.atomic
def seed_demo() -> DemoResult:
    """Create the operator, the tenant ``alice`` owning project ``demo``, and the GPU catalog."""
    from controlplane.accounts.choices import Role
    from controlplane.accounts.models import Membership, Project

    result = DemoResult()
    operator, operator_pw = _ensure_user(username=OPERATOR_USERNAME, env_var="DEMO_OPERATOR_PASSWORD", staff=True)
    result.logins.append(Login(OPERATOR_USERNAME, operator_pw, "operator (staff, superuser)"))
    alice, alice_pw = _ensure_user(username=TENANT_USERNAME, env_var="DEMO_TENANT_PASSWORD", staff=False)
    result.logins.append(Login(TENANT_USERNAME, alice_pw, f"tenant, owner of project {DEMO_PROJECT_SLUG}"))

    project, _ = Project.objects.get_or_create(slug=DEMO_PROJECT_SLUG, defaults={"name": "Demo project"})
    Membership.objects.get_or_create(project=project, user=alice, defaults={"role": Role.OWNER})

    created = seed_catalog()
    if created:
        result.notes.append(f"GPU catalog: added {', '.join(created)}")
    result.notes.append(_seed_ledger(project=project, actor=operator))
    result.notes.append(_seed_queue_classes(project=project))
    return result


def operator_user() -> Any:
    return get_user_model().objects.get(username=OPERATOR_USERNAME)
