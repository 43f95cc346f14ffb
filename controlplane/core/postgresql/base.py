"""Django's PostgreSQL backend, whose per-request connection check asks the socket before the server.

With ``CONN_HEALTH_CHECKS`` Django tests a persistent connection at its first use in every request with a
``SELECT 1``: one round trip more for every request, a fifth of a steady heartbeat's (the check, BEGIN, the
locking read, the writes, COMMIT) and a third of ``GET /api/v1/me/``'s. The failures it exists for (PostgreSQL
restarted, a failover, the backend terminated, an idle timeout) all end with the server closing the
connection, after a FATAL message: an idle connection's socket then has something to read, or its end. A
healthy idle connection has nothing to read, which a zero-timeout ``select`` tells without leaving the
machine. So: nothing to read, the connection is used as it is; anything to read (the goodbye, or a notice),
the ``SELECT 1`` decides, as before. A server that vanished without closing (a partition) is found out by
neither before the statement's own timeout, as before.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        connection = self.connection
        if connection is None or connection.closed or connection.broken:
            return False
        pgconn = connection.pgconn
        if pgconn.status != pq.ConnStatus.OK or pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return bool(super().is_usable())
        try:
            readable, _, _ = select.select([pgconn.socket], [], [], 0)
        except (OSError, ValueError):  # a socket already closed under it
            return False
        return True if not readable else bool(super().is_usable())
