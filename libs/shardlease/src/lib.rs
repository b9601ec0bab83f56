//! etcd-backed shard epochs, the one-active-decide leader lease, and work-endpoint discovery.
