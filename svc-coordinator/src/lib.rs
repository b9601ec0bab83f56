//! bigfleet-coordinator: the openraft-replicated fleet coordinator.
