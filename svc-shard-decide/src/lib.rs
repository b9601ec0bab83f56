//! bigfleet-shard-decide: the shard's brain (inventory, reconcile, cycle, action ledger).
