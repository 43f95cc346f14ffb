"""PostgreSQL: a summary of bookable capacity per server and GPU model, kept exact by triggers, and an index
on the allocations' periods, so that a booking reads a few servers whatever the fleet's size.

``reservations_server_capacity`` holds, per server and GPU model, how many of the server's GPUs are
present and healthy (``healthy``), with the server's hostname and whether it is ready. Triggers on the GPU
and server tables change it in the same statement as the row they follow, by adding and subtracting one:
concurrent writers to one server's GPUs add up (each UPDATE locks the summary row), so it never drifts,
whatever wrote the row (the ORM, a bulk update, SQL by hand). A TRUNCATE of the GPUs empties it too.

It is a count of inventory, not of bookings: what a window leaves free is read from the allocations, through
the GiST index on their periods, for the servers that hold any. A booking by minimum memory, of whole servers,
or of more GPUs than one server has reads the GPUs, as SQLite always does.
"""

from django.db import migrations

CREATE = """
CREATE TABLE reservations_server_capacity (
    server_id bigint NOT NULL,
    model_id bigint NOT NULL,
    hostname varchar(253) COLLATE "C" NOT NULL,
    ready boolean NOT NULL,
    healthy integer NOT NULL CHECK (healthy >= 0),
    PRIMARY KEY (server_id, model_id)
);
CREATE INDEX reservations_server_capacity_fit ON reservations_server_capacity (model_id, healthy, hostname)
    WHERE ready;

CREATE FUNCTION reservations_capacity_gpu() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE FUNCTION reservations_capacity_server() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM reservations_server_capacity WHERE server_id = OLD.id;
    ELSE
        UPDATE reservations_server_capacity SET hostname = NEW.hostname, ready = NEW.state = 'ready'
        WHERE server_id = NEW.id;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION reservations_capacity_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM reservations_server_capacity;
    RETURN NULL;
END $$;

CREATE TRIGGER reservations_capacity_gpu_insert AFTER INSERT ON inventory_gpu
    FOR EACH ROW WHEN (NEW.present AND NEW.health = 'healthy') EXECUTE FUNCTION reservations_capacity_gpu();
CREATE TRIGGER reservations_capacity_gpu_delete AFTER DELETE ON inventory_gpu
    FOR EACH ROW WHEN (OLD.present AND OLD.health = 'healthy') EXECUTE FUNCTION reservations_capacity_gpu();
-- Only the columns the count depends on: a heartbeat's telemetry update does not run it.
CREATE TRIGGER reservations_capacity_gpu_update
    AFTER UPDATE OF present, health, server_id, model_id ON inventory_gpu
    FOR EACH ROW WHEN (
        (OLD.present AND OLD.health = 'healthy') IS DISTINCT FROM (NEW.present AND NEW.health = 'healthy')
        OR OLD.server_id <> NEW.server_id OR OLD.model_id <> NEW.model_id
    ) EXECUTE FUNCTION reservations_capacity_gpu();
CREATE TRIGGER reservations_capacity_server_update AFTER UPDATE OF state, hostname ON inventory_server
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.hostname IS DISTINCT FROM NEW.hostname)
    EXECUTE FUNCTION reservations_capacity_server();
CREATE TRIGGER reservations_capacity_server_delete AFTER DELETE ON inventory_server
    FOR EACH ROW EXECUTE FUNCTION reservations_capacity_server();
CREATE TRIGGER reservations_capacity_gpu_truncate AFTER TRUNCATE ON inventory_gpu
    FOR EACH STATEMENT EXECUTE FUNCTION reservations_capacity_truncate();

INSERT INTO reservations_server_capacity (server_id, model_id, hostname, ready, healthy)
SELECT g.server_id, g.model_id, s.hostname, s.state = 'ready', count(*)
FROM inventory_gpu g JOIN inventory_server s ON s.id = g.server_id
WHERE g.present AND g.health = 'healthy'
GROUP BY g.server_id, g.model_id, s.hostname, s.state;

CREATE INDEX allocation_active_period ON reservations_allocation
    USING gist (tstzrange(starts_at, ends_at, '[)')) WHERE active;
"""

DROP = """
DROP INDEX IF EXISTS allocation_active_period;
DROP TRIGGER IF EXISTS reservations_capacity_gpu_insert ON inventory_gpu;
DROP TRIGGER IF EXISTS reservations_capacity_gpu_delete ON inventory_gpu;
DROP TRIGGER IF EXISTS reservations_capacity_gpu_update ON inventory_gpu;
DROP TRIGGER IF EXISTS reservations_capacity_gpu_truncate ON inventory_gpu;
DROP TRIGGER IF EXISTS reservations_capacity_server_update ON inventory_server;
DROP TRIGGER IF EXISTS reservations_capacity_server_delete ON inventory_server;
DROP FUNCTION IF EXISTS reservations_capacity_gpu();
DROP FUNCTION IF EXISTS reservations_capacity_server();
DROP FUNCTION IF EXISTS reservations_capacity_truncate();
DROP TABLE IF EXISTS reservations_server_capacity;
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("reservations", "0003_reservation_network_reservation_volumes"),
        ("inventory", "0003_alter_serverevent_kind"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
