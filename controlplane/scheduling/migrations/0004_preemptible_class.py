from decimal import Decimal

from django.db import migrations


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    PriorityClass = apps.get_model("scheduling", "PriorityClass")
    PriorityClass.objects.get_or_create(
        name="preemptible",
        defaults={"rank": 10, "credit_multiplier": Decimal("0.5"), "notice_seconds": 120, "preemptible": True},
    )


def remove(apps, schema_editor):  # type: ignore[no-untyped-def]
    apps.get_model("scheduling", "PriorityClass").objects.filter(name="preemptible").delete()


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0003_request_requeue")]

    operations = [migrations.RunPython(create, remove)]
