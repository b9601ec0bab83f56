//! Shard epochs (epoch file), fencing tokens and sequence minting.
