//! rustls configs from --tls-* flags, certificate reload, and PeerIdentity from bigfleet:// URI SANs.
