"""The search: space, named constraints, the exhaustive oracle, the CP-SAT program, explanations."""
