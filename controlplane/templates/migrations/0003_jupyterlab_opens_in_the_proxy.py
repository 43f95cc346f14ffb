from django.db import migrations
from django.utils import timezone


def update_shipped(apps, schema_editor):  # type: ignore[no-untyped-def]
    from controlplane.templates.shipped import open_jupyterlab_in_the_proxy

    open_jupyterlab_in_the_proxy(apps.get_model("templates", "LaunchTemplate"), now=timezone.now())


class Migration(migrations.Migration):
    dependencies = [("templates", "0002_shipped_templates")]

    operations = [migrations.RunPython(update_shipped, migrations.RunPython.noop)]
