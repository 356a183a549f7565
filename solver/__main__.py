"""`python -m solver` runs the parplan CLI."""

from solver.cli import main

main()
