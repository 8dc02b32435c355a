"""The solvers behind the MILP (`model.py`): OR-Tools (SCIP or CP-SAT) and PuLP (HiGHS or CBC), each
behind the same small interface (`var`, `add`, `sum`, `minimize`, `hint`, `solve`, `value`) and
each mapping its termination codes onto the statuses of `instance.py`."""

from __future__ import annotations

from .instance import STATUS_FEASIBLE, STATUS_INFEASIBLE, STATUS_NOT_SOLVED, STATUS_OPTIMAL


class _OrTools:
    def __init__(self, solver_id: str):
        from ortools.linear_solver import pywraplp

        self.s = pywraplp.Solver.CreateSolver(solver_id)
        if self.s is None:
            raise RuntimeError(f"OR-Tools has no {solver_id} solver here")
        self.inf = self.s.infinity()

    def var(self, name, lb, ub, integer):
        ub = self.inf if ub is None else ub
        return self.s.IntVar(lb, ub, name) if integer else self.s.NumVar(lb, ub, name)

    def add(self, ct, name):
        self.s.Add(ct, name)

    def sum(self, terms):
        from ortools.linear_solver import pywraplp
        return pywraplp.SumArray(list(terms))

    def minimize(self, expr):
        self.s.Minimize(expr)

    def hint(self, pairs) -> None:
        """A starting solution for the search (SCIP and CP-SAT take it as an incumbent to improve)."""
        pairs = list(pairs)
        self.s.SetHint([v for v, _ in pairs], [float(x) for _, x in pairs])

    def solve(self, time_limit_s: float, threads: int):
        from ortools.linear_solver import pywraplp

        self.s.SetTimeLimit(int(time_limit_s * 1000))
        self.s.SetNumThreads(threads)
        code = self.s.Solve()
        status = {pywraplp.Solver.OPTIMAL: STATUS_OPTIMAL, pywraplp.Solver.FEASIBLE: STATUS_FEASIBLE,
                  pywraplp.Solver.INFEASIBLE: STATUS_INFEASIBLE}.get(code, STATUS_NOT_SOLVED)
        if status in (STATUS_OPTIMAL, STATUS_FEASIBLE):
            obj = self.s.Objective().Value()
            bound = self.s.Objective().BestBound()
            return status, obj, bound
        return status, float("nan"), float("nan")

    @staticmethod
    def value(v):
        return v.solution_value()


class _Pulp:
    def __init__(self, solver_name: str):
        import pulp

        self.pulp = pulp
        self.m = pulp.LpProblem("statebudget", pulp.LpMinimize)
        self.solver_name = solver_name

    def var(self, name, lb, ub, integer):
        cat = "Integer" if integer else "Continuous"
        if hasattr(self.m, "add_variable"):  # PuLP >= 3.3
            return self.m.add_variable(name, lb, ub, cat=cat)
        return self.pulp.LpVariable(name, lb, ub, cat=cat)

    def add(self, ct, name):
        if isinstance(ct, bool):  # a constant constraint (no variables): must hold
            if not ct:
                raise ValueError(f"constraint {name} cannot hold")
            return
        self.m += ct, name

    def sum(self, terms):
        return self.pulp.lpSum(list(terms))

    def minimize(self, expr):
        self.m += expr

    def hint(self, pairs) -> None:
        """Ignored. HiGHS through PuLP takes no start. CBC takes one (`warmStart`), but with it CBC
        3.x returned schedules up to 2,000x the optimum still marked optimal (a 15-minute swe-team
        window: 121.7 against 0.13 without the start, and HiGHS's 0.13)."""

    def solve(self, time_limit_s: float, threads: int):
        pulp = self.pulp
        if self.solver_name == "HiGHS":
            solver = pulp.getSolver("HiGHS", msg=False, timeLimit=time_limit_s, threads=threads)
        else:
            solver = pulp.getSolver("PULP_CBC_CMD", msg=False, timeLimit=time_limit_s, threads=threads)
        self.m.solve(solver)
        st = pulp.LpStatus[self.m.status]
        obj = pulp.value(self.m.objective)
        # PuLP's status says "Optimal" also for a solver stopped at its time limit with a solution;
        # the solution status tells a proven optimum from a merely feasible one
        proven = getattr(self.m, "sol_status", pulp.LpSolutionOptimal) == pulp.LpSolutionOptimal
        if st == "Optimal" and proven:
            return STATUS_OPTIMAL, float(obj), float(obj)
        if obj is not None and st in ("Optimal", "Not Solved"):
            return STATUS_FEASIBLE, float(obj), float("nan")
        return (STATUS_INFEASIBLE if st == "Infeasible" else STATUS_NOT_SOLVED), float("nan"), float("nan")

    @staticmethod
    def value(v):
        return v.value() or 0.0


BACKENDS = {"scip": lambda: _OrTools("SCIP"), "cp-sat": lambda: _OrTools("CP-SAT"),
            "highs": lambda: _Pulp("HiGHS"), "cbc": lambda: _Pulp("CBC")}
