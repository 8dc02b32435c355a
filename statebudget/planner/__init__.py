"""The online control-plane core, without HTTP: predictor, leases, planner loop. The simulator's
`statebudget` policies and the service call this same code."""
