"""Django's PostgreSQL backend with a connection health check that costs no round trip (base.py)."""
