"""The CP-SAT model of the mapping space: variables, named constraints and the
piecewise-linear lower-bound objective (see solver.search.solve for the certified loop)."""
