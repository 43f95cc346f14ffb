from django.db import migrations


def restrict(apps, schema_editor):  # type: ignore[no-untyped-def]
    # Only projects whose quota policy an operator grants it may queue in "high" (docs/scheduling.md).
    apps.get_model("scheduling", "PriorityClass").objects.filter(name="high").update(restricted=True)


def unrestrict(apps, schema_editor):  # type: ignore[no-untyped-def]
    apps.get_model("scheduling", "PriorityClass").objects.filter(name="high").update(restricted=False)


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0005_queue_order_and_class_rules")]

    operations = [migrations.RunPython(restrict, unrestrict)]
