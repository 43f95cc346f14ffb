from decimal import Decimal

from django.db import migrations

CLASSES = (("high", 100, Decimal("1.5")), ("normal", 50, Decimal("1.0")))


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    PriorityClass = apps.get_model("scheduling", "PriorityClass")
    for name, rank, multiplier in CLASSES:
        PriorityClass.objects.get_or_create(name=name, defaults={"rank": rank, "credit_multiplier": multiplier})


def remove(apps, schema_editor):  # type: ignore[no-untyped-def]
    apps.get_model("scheduling", "PriorityClass").objects.filter(name__in=[c[0] for c in CLASSES]).delete()


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0001_initial")]

    operations = [migrations.RunPython(create, remove)]
