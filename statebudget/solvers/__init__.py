"""Solvers: the one cost model, the online greedy solver and the offline MILP (no sim, no api imports)."""
