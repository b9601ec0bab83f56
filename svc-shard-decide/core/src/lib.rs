//! The shard cycle: inventory, NeedsTable, reconcile, engine invocation, rails, action ledger and the Decide service. Never depends on the coordinator (hard rule 1).
