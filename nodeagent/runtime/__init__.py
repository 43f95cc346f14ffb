"""Container runtimes the agent launches reservations with."""
