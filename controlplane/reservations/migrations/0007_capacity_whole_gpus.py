"""PostgreSQL: the capacity summary of 0004 counts only GPUs that can be booked whole, so a GPU in MIG mode
(``mig.current`` true) drops out of it, as it does from the matching predicate (``selectors.gpu_matches``):
CUDA uses such a GPU only through its MIG devices (docs/fractional.md, "Booking slices").

The triggers are 0004's with one more condition and one more column to watch (``mig``, which a heartbeat
rewrites only when the reported MIG state changes); the summary is counted again from the GPU table.
"""

from django.db import migrations

# Usable whole, as selectors.usable_whole_q says it: MIG mode not on (no MIG state, off, or none reported).
_COUNTED = "{row}.present AND {row}.health = 'healthy' AND ({row}.mig -> 'current') IS DISTINCT FROM 'true'::jsonb"


def _triggers(counted: str, update_of: str) -> str:
    old, new = counted.format(row="OLD"), counted.format(row="NEW")
    return f"""
DROP TRIGGER IF EXISTS reservations_capacity_gpu_insert ON inventory_gpu;
DROP TRIGGER IF EXISTS reservations_capacity_gpu_delete ON inventory_gpu;
DROP TRIGGER IF EXISTS reservations_capacity_gpu_update ON inventory_gpu;

CREATE OR REPLACE FUNCTION reservations_capacity_gpu() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND {old} THEN
        UPDATE reservations_server_capacity SET healthy = healthy - 1
        WHERE server_id = OLD.server_id AND model_id = OLD.model_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND {new} THEN
        INSERT INTO reservations_server_capacity AS c (server_id, model_id, hostname, ready, healthy)
        SELECT NEW.server_id, NEW.model_id, s.hostname, s.state = 'ready', 1
        FROM inventory_server s WHERE s.id = NEW.server_id
        ON CONFLICT (server_id, model_id) DO UPDATE SET healthy = c.healthy + 1;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER reservations_capacity_gpu_insert AFTER INSERT ON inventory_gpu
    FOR EACH ROW WHEN ({new}) EXECUTE FUNCTION reservations_capacity_gpu();
CREATE TRIGGER reservations_capacity_gpu_delete AFTER DELETE ON inventory_gpu
    FOR EACH ROW WHEN ({old}) EXECUTE FUNCTION reservations_capacity_gpu();
CREATE TRIGGER reservations_capacity_gpu_update
    AFTER UPDATE OF {update_of} ON inventory_gpu
    FOR EACH ROW WHEN (
        ({old}) IS DISTINCT FROM ({new})
        OR OLD.server_id <> NEW.server_id OR OLD.model_id <> NEW.model_id
    ) EXECUTE FUNCTION reservations_capacity_gpu();

DELETE FROM reservations_server_capacity;
INSERT INTO reservations_server_capacity (server_id, model_id, hostname, ready, healthy)
SELECT g.server_id, g.model_id, s.hostname, s.state = 'ready', count(*)
FROM inventory_gpu g JOIN inventory_server s ON s.id = g.server_id
WHERE {counted.format(row="g")}
GROUP BY g.server_id, g.model_id, s.hostname, s.state;
"""


CREATE = _triggers(_COUNTED, "present, health, mig, server_id, model_id")
# Back to 0004's count: present and healthy, whatever the MIG mode.
DROP = _triggers("{row}.present AND {row}.health = 'healthy'", "present, health, server_id, model_id")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("reservations", "0006_mig_slices"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
