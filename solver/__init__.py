"""Searching the mapping space: the space declaration, exact counting, brute force, and the
certified CP-SAT solver, plus the `mapsat` command line."""
