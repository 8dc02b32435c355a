"""Engine adapters: the processes beside an engine that poll the planner's plan, execute its ops
and report them (DESIGN.md §7). One protocol (`base.Adapter`), one registry keyed by kind."""
