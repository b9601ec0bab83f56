//! Shared sentinel for compact records.

/// "No id" in compact records (unbound cluster, absent attribute, no group...).
pub(crate) const NONE: u32 = u32::MAX;
