"""The search: space, named constraints, the exhaustive oracle, the layout program (CP-SAT), the layout search, explanations."""
