from django.db import migrations
from django.utils import timezone


def load_shipped(apps, schema_editor):  # type: ignore[no-untyped-def]
    from controlplane.templates.shipped import load

    load(apps.get_model("templates", "LaunchTemplate"), now=timezone.now())


class Migration(migrations.Migration):
    dependencies = [("templates", "0001_launch_template")]

    operations = [migrations.RunPython(load_shipped, migrations.RunPython.noop)]
