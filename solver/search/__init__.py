"""Searching the space: exhaustive scoring (`brute`) and the certified CP-SAT search
(`solve`, with its model in `cpsat/`)."""
