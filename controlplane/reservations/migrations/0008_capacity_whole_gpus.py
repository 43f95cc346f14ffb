"""PostgreSQL: the capacity summary's ``healthy`` counts only GPUs that can be booked whole, so a GPU in MIG
mode (``mig.current`` true) drops out of it, as it does from the matching predicate (``selectors.gpu_matches``,
``usable_whole_q``): CUDA uses such a GPU only through its MIG devices (docs/fractional.md, "Booking slices").
``gpus`` still counts every GPU row, so a server with a GPU in MIG mode has ``healthy < gpus`` and the booking
reads its matching GPUs instead of trusting the per-server busy count (0007).

The GPU trigger is 0007's with the MIG condition in the healthy count, and the update trigger watches one more
column (``mig``, which a heartbeat rewrites only when the reported MIG state changes); the summary is counted
again from the GPU table.
"""

from django.db import migrations

# Usable whole, as selectors.usable_whole_q says it: MIG mode not on (no MIG state, off, or none reported).
_WHOLE = "{row}.present AND {row}.health = 'healthy' AND ({row}.mig -> 'current') IS DISTINCT FROM 'true'::jsonb"
# 0004's and 0007's count: present and healthy, whatever the MIG mode.
_ANY_MODE = "{row}.present AND {row}.health = 'healthy'"


def _summary(counted: str, update_of: str) -> str:
    old, new, row = counted.format(row="OLD"), counted.format(row="NEW"), counted.format(row="g")
    return f"""
CREATE OR REPLACE FUNCTION reservations_capacity_gpu() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE reservations_server_capacity
        SET gpus = gpus - 1, healthy = healthy - ({old})::integer
        WHERE server_id = OLD.server_id AND model_id = OLD.model_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO reservations_server_capacity AS c (server_id, model_id, hostname, ready, healthy, gpus)
        SELECT NEW.server_id, NEW.model_id, s.hostname, s.state = 'ready', ({new})::integer, 1
        FROM inventory_server s WHERE s.id = NEW.server_id
        ON CONFLICT (server_id, model_id) DO UPDATE SET healthy = c.healthy + EXCLUDED.healthy, gpus = c.gpus + 1;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER reservations_capacity_gpu_update ON inventory_gpu;
CREATE TRIGGER reservations_capacity_gpu_update
    AFTER UPDATE OF {update_of} ON inventory_gpu
    FOR EACH ROW WHEN (
        ({old}) IS DISTINCT FROM ({new})
        OR OLD.server_id <> NEW.server_id OR OLD.model_id <> NEW.model_id
    ) EXECUTE FUNCTION reservations_capacity_gpu();

LOCK TABLE inventory_gpu IN SHARE MODE;
DELETE FROM reservations_server_capacity;
INSERT INTO reservations_server_capacity (server_id, model_id, hostname, ready, healthy, gpus)
SELECT g.server_id, g.model_id, s.hostname, s.state = 'ready', count(*) FILTER (WHERE {row}), count(*)
FROM inventory_gpu g JOIN inventory_server s ON s.id = g.server_id
GROUP BY g.server_id, g.model_id, s.hostname, s.state;
"""


CREATE = _summary(_WHOLE, "present, health, mig, server_id, model_id")
DROP = _summary(_ANY_MODE, "present, health, server_id, model_id")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("reservations", "0007_allocation_server"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
