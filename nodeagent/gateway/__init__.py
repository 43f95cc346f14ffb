"""The node agent's SSH gateway (asyncssh): tenants reach their reservation's container, and nothing else.

See ``server.SshGateway`` and docs/agent.md, "SSH gateway".
"""

from nodeagent.gateway.server import SshGateway

__all__ = ["SshGateway"]
