"""The exclusion constraint that makes double booking impossible on PostgreSQL.

It runs only on PostgreSQL; SQLite serialises writers (IMMEDIATE transactions) and the booking service
checks overlaps under that lock.
"""

from django.db import migrations

CREATE = """
CREATE EXTENSION IF NOT EXISTS btree_gist;
ALTER TABLE reservations_allocation ADD CONSTRAINT allocation_no_overlap
    EXCLUDE USING gist (gpu_id WITH =, tstzrange(starts_at, ends_at, '[)') WITH &&) WHERE (active);
"""
DROP = "ALTER TABLE reservations_allocation DROP CONSTRAINT IF EXISTS allocation_no_overlap;"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("reservations", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
