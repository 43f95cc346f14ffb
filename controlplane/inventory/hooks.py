"""What the inventory asks of apps above it, filled in by those apps' ``AppConfig.ready()``.

A retired server's agent has nothing more to say, so its credential goes with it; credentials are the fleet's,
above this app. Required (``core.hooks``): retiring a server without revoking its agent would leave a working
credential for a machine that left the fleet.
"""

from __future__ import annotations

from typing import Any

from controlplane.core.hooks import RequiredHook

# (server, actor, reason): revoke the retired server's active agent credentials, in the retiring transaction.
server_retired: RequiredHook[[Any, Any, str], None] = RequiredHook(
    "inventory.server_retired", provider="controlplane.fleet"
)
