"""The live planner behind the API: programs, leases, the op journal, the durable ledger."""
