"""`python -m splitserve.cli ...` (torchrun launches split training this way)."""

from splitserve.cli import main

main()
