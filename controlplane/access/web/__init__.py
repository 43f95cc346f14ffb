"""The web proxy (docs/proxy.md): tenants' container web apps and a web terminal in the browser, relayed by
the control plane through each node's SSH gateway. ``grants`` decides who may open what, ``links`` signs the
links and cookies, ``portalkeys`` derives the keys the proxy logs in to gateways with, ``server`` is the
proxy itself (aiohttp), ``tunnels`` its SSH connections, ``terminal`` the web terminal."""
