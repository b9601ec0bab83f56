//! bigfleet-shard-execute: the worker pool that runs actions against the provider.
