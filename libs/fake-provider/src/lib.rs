//! An in-repo CapacityProvider: catalog seeding, latency and failure injection, fencing high-water marks.
