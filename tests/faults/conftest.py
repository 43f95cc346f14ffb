"""Fault tests: real services broken on purpose. Each test module owns the fault it injects (a private
redis-server or PostgreSQL on a free port, terminated backends, killed processes, a stopped TCP proxy) and
leaves the shared PostgreSQL and Redis running. Every test here runs once, in the PostgreSQL leg (see
tests/conftest.py)."""
