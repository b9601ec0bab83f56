//! Proto <-> domain conversion and validation: the trust-boundary gate.
