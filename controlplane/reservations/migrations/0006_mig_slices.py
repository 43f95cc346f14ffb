"""MIG slices are booked under their parent GPU: every allocation covers a span of the GPU's eight memory
slices, and the exclusion constraint of 0002 gains it (docs/fractional.md, "Booking slices").

Existing allocations are whole GPUs, [0, 8) by the defaults. Like 0002, the constraint runs only on
PostgreSQL; SQLite serialises writers (IMMEDIATE transactions) and the booking service checks overlaps,
spans included, under that lock.
"""

import django.db.models.deletion
from django.db import migrations, models

CREATE = """
ALTER TABLE reservations_allocation DROP CONSTRAINT IF EXISTS allocation_no_overlap;
ALTER TABLE reservations_allocation ADD CONSTRAINT allocation_no_overlap
    EXCLUDE USING gist (
        gpu_id WITH =,
        int4range(slice_start, slice_end, '[)') WITH &&,
        tstzrange(starts_at, ends_at, '[)') WITH &&
    ) WHERE (active);
"""
# Back to 0002's whole-GPU constraint.
DROP = """
ALTER TABLE reservations_allocation DROP CONSTRAINT IF EXISTS allocation_no_overlap;
ALTER TABLE reservations_allocation ADD CONSTRAINT allocation_no_overlap
    EXCLUDE USING gist (gpu_id WITH =, tstzrange(starts_at, ends_at, '[)') WITH &&) WHERE (active);
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0005_energy"),
        ("reservations", "0005_reservation_preemption"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="allocation",
            name="allocation_one_per_gpu_per_reservation",
        ),
        migrations.AddField(
            model_name="allocation",
            name="mig_device",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="allocations",
                to="inventory.migdevice",
            ),
        ),
        migrations.AddField(
            model_name="allocation",
            name="slice_end",
            field=models.PositiveSmallIntegerField(default=8),
        ),
        migrations.AddField(
            model_name="allocation",
            name="slice_start",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddConstraint(
            model_name="allocation",
            constraint=models.CheckConstraint(
                condition=models.Q(("slice_end__lte", 8), ("slice_start__lt", models.F("slice_end"))),
                name="allocation_slices_not_empty",
            ),
        ),
        migrations.AddConstraint(
            model_name="allocation",
            constraint=models.UniqueConstraint(
                fields=("reservation", "gpu", "slice_start"), name="allocation_one_per_slice_per_reservation"
            ),
        ),

        migrations.RemoveConstraint(
            model_name='reservation',
            name='reservation_model_or_memory',
        ),
        migrations.AddField(
            model_name='reservation',
            name='mig_profile',
            field=models.CharField(blank=True, default='', max_length=32),
        ),
        migrations.AddConstraint(
            model_name='reservation',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('gpu_model__isnull', False), ('mig_profile', ''), ('min_memory_mib__isnull', True)), models.Q(('gpu_model__isnull', True), ('mig_profile', ''), ('min_memory_mib__isnull', False)), models.Q(('gpu_model__isnull', True), ('min_memory_mib__isnull', True), ('whole_servers__isnull', True), models.Q(('mig_profile', ''), _negated=True)), _connector='OR'), name='reservation_model_or_memory'),
        ),
        migrations.RunPython(forwards, backwards),
    ]
