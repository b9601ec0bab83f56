//! The shard's coordinator reporting client; knows the shard only through the ShardView trait.
