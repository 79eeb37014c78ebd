"""Searching the mapping space, laid out in the order data flows:
space (declaration, count, enumeration) → search (brute force, CP-SAT) → study (batches,
store, shapes) and report (tables, plots) → cli (the `mapsat` command). See
docs/architecture.md."""
