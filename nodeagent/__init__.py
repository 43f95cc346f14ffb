"""The node agent: reports a server's GPUs, health and utilization, and runs the containers it is told to.

It never imports Django; it talks to the control plane through the versioned JSON in ``nodeagent.schema``.
"""

__version__ = "0.1.0"
