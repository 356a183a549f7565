"""The search: the space and its named constraints, the exhaustive oracle over meshes and
schedules (enumerate), the layout program (CP-SAT, layout_program) and the search over both
(layout_search), the explanations."""
