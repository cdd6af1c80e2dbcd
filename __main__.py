"""`python -m kd ...`: the same command line as the `kd` script (torchrun -m kd works too)."""

from kd.cli import main

main()
