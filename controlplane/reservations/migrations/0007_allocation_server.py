"""Every allocation names its GPU's server, kept exact by the database, so that a booking counts the busy
GPUs of a window per server from the allocations alone (docs/reservations.md, "Placement").

A GPU can change servers (a card moved to another machine keeps its row, fleet.ingest), so the column is
not a copy taken at booking: on PostgreSQL a foreign key ``(gpu_id, server_id)`` references the GPU's
``(id, server_id)`` with ON UPDATE CASCADE, so a move rewrites the GPU's allocations in the same statement
and no row can name another server; on SQLite triggers refuse a mismatch and follow a move.

The capacity summary of 0004 gains ``gpus``, every GPU row of the server and model whatever its presence
or health: where a server's rows add up to the ``healthy`` count of the booking's model, every GPU on it
matches, so its busy GPUs need no read of the GPU table. The GiST index on the active periods includes the
server and GPU ids (and the period's columns), so that count is an index-only scan.
"""

import django.db.models.deletion
from django.db import migrations, models

BACKFILL = """
UPDATE reservations_allocation SET server_id = (
    SELECT g.server_id FROM inventory_gpu g WHERE g.id = reservations_allocation.gpu_id
)
"""

# The GPU trigger of 0004, counting every row in ``gpus`` and the present, healthy ones in ``healthy``.
_GPU_FUNCTION = """
CREATE OR REPLACE FUNCTION reservations_capacity_gpu() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE reservations_server_capacity
        SET gpus = gpus - 1, healthy = healthy - (OLD.present AND OLD.health = 'healthy')::integer
        WHERE server_id = OLD.server_id AND model_id = OLD.model_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO reservations_server_capacity AS c (server_id, model_id, hostname, ready, healthy, gpus)
        SELECT NEW.server_id, NEW.model_id, s.hostname, s.state = 'ready',
               (NEW.present AND NEW.health = 'healthy')::integer, 1
        FROM inventory_server s WHERE s.id = NEW.server_id
        ON CONFLICT (server_id, model_id) DO UPDATE SET healthy = c.healthy + EXCLUDED.healthy, gpus = c.gpus + 1;
    END IF;
    RETURN NULL;
END $$;
"""

_GPU_TRIGGERS = """
DROP TRIGGER reservations_capacity_gpu_insert ON inventory_gpu;
DROP TRIGGER reservations_capacity_gpu_delete ON inventory_gpu;
CREATE TRIGGER reservations_capacity_gpu_insert AFTER INSERT ON inventory_gpu
    FOR EACH ROW EXECUTE FUNCTION reservations_capacity_gpu();
CREATE TRIGGER reservations_capacity_gpu_delete AFTER DELETE ON inventory_gpu
    FOR EACH ROW EXECUTE FUNCTION reservations_capacity_gpu();
"""

POSTGRES = f"""
ALTER TABLE inventory_gpu ADD CONSTRAINT inventory_gpu_id_server UNIQUE (id, server_id);
ALTER TABLE reservations_allocation ADD CONSTRAINT allocation_gpu_server
    FOREIGN KEY (gpu_id, server_id) REFERENCES inventory_gpu (id, server_id) ON UPDATE CASCADE;

-- The period's own columns too: the planner takes an index-only scan only when every column the query
-- names is in the index, and the range is an expression over them.
DROP INDEX allocation_active_period;
CREATE INDEX allocation_active_period ON reservations_allocation
    USING gist (tstzrange(starts_at, ends_at, '[)')) INCLUDE (server_id, gpu_id, starts_at, ends_at) WHERE active;

ALTER TABLE reservations_server_capacity ADD COLUMN gpus integer NOT NULL DEFAULT 0;
{_GPU_FUNCTION}
{_GPU_TRIGGERS}
LOCK TABLE inventory_gpu IN SHARE MODE;
DELETE FROM reservations_server_capacity;
INSERT INTO reservations_server_capacity (server_id, model_id, hostname, ready, healthy, gpus)
SELECT g.server_id, g.model_id, s.hostname, s.state = 'ready',
       count(*) FILTER (WHERE g.present AND g.health = 'healthy'), count(*)
FROM inventory_gpu g JOIN inventory_server s ON s.id = g.server_id
GROUP BY g.server_id, g.model_id, s.hostname, s.state;
ALTER TABLE reservations_server_capacity ADD CONSTRAINT reservations_server_capacity_gpus CHECK (gpus >= healthy);
"""

# Back to 0004's summary and index. The rows whose healthy count is 0 stay; 0004's read skips them too.
POSTGRES_BACK = """
ALTER TABLE reservations_allocation DROP CONSTRAINT allocation_gpu_server;
ALTER TABLE inventory_gpu DROP CONSTRAINT inventory_gpu_id_server;
DROP INDEX allocation_active_period;
CREATE INDEX allocation_active_period ON reservations_allocation
    USING gist (tstzrange(starts_at, ends_at, '[)')) WHERE active;
CREATE OR REPLACE FUNCTION reservations_capacity_gpu() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.present AND OLD.health = 'healthy' THEN
        UPDATE reservations_server_capacity SET healthy = healthy - 1
        WHERE server_id = OLD.server_id AND model_id = OLD.model_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.present AND NEW.health = 'healthy' THEN
        INSERT INTO reservations_server_capacity AS c (server_id, model_id, hostname, ready, healthy)
        SELECT NEW.server_id, NEW.model_id, s.hostname, s.state = 'ready', 1
        FROM inventory_server s WHERE s.id = NEW.server_id
        ON CONFLICT (server_id, model_id) DO UPDATE SET healthy = c.healthy + 1;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER reservations_capacity_gpu_insert ON inventory_gpu;
DROP TRIGGER reservations_capacity_gpu_delete ON inventory_gpu;
CREATE TRIGGER reservations_capacity_gpu_insert AFTER INSERT ON inventory_gpu
    FOR EACH ROW WHEN (NEW.present AND NEW.health = 'healthy') EXECUTE FUNCTION reservations_capacity_gpu();
CREATE TRIGGER reservations_capacity_gpu_delete AFTER DELETE ON inventory_gpu
    FOR EACH ROW WHEN (OLD.present AND OLD.health = 'healthy') EXECUTE FUNCTION reservations_capacity_gpu();
ALTER TABLE reservations_server_capacity DROP COLUMN gpus;
"""

# SQLite: no composite foreign key can be added to a table in place, so triggers keep the column exact.
# (A later migration that makes either table again on SQLite drops them; tests/reservations/
# test_allocation_server.py fails then.)
_SQLITE_MISMATCH = (
    "NEW.server_id IS NOT (SELECT g.server_id FROM inventory_gpu g WHERE g.id = NEW.gpu_id) "
    "BEGIN SELECT RAISE(ABORT, 'allocation_gpu_server: an allocation''s server_id must be its GPU''s'); END"
)
SQLITE = [
    f"CREATE TRIGGER allocation_gpu_server_insert BEFORE INSERT ON reservations_allocation WHEN {_SQLITE_MISMATCH}",
    "CREATE TRIGGER allocation_gpu_server_update BEFORE UPDATE OF gpu_id, server_id ON reservations_allocation "
    f"WHEN {_SQLITE_MISMATCH}",
    "CREATE TRIGGER allocation_gpu_server_follows AFTER UPDATE OF server_id ON inventory_gpu "
    "WHEN NEW.server_id IS NOT OLD.server_id "
    "BEGIN UPDATE reservations_allocation SET server_id = NEW.server_id WHERE gpu_id = NEW.id; END",
]
SQLITE_BACK = [
    "DROP TRIGGER IF EXISTS allocation_gpu_server_insert",
    "DROP TRIGGER IF EXISTS allocation_gpu_server_update",
    "DROP TRIGGER IF EXISTS allocation_gpu_server_follows",
]


def backfill(apps, schema_editor):
    schema_editor.execute(BACKFILL)


def keep_exact(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE:
            schema_editor.execute(statement)


def keep_exact_back(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_BACK)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_BACK:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0005_energy"),
        ("reservations", "0006_mig_slices"),
    ]

    operations = [
        migrations.AddField(
            model_name="allocation",
            name="server",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="inventory.server",
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="allocation",
            name="server",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="inventory.server",
            ),
        ),
        migrations.RunPython(keep_exact, keep_exact_back),
    ]
