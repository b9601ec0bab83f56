//! bigfleet-inspect: the read-only fleet view (gRPC, JSON API, dashboard).
