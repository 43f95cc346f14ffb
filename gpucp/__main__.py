"""``python -m gpucp``: the same as the ``gpucp`` console script."""

from gpucp.cli import main

main()
