//! bigfleet-session-gateway: terminates operator Shard/Session streams.
