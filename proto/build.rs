//! Compiles every `.proto` under `bigfleet/` with protoc (found through
//! `PROTOC`, see `.cargo/config.toml` and docs/adr/0001) into Rust modules
//! plus one encoded `FileDescriptorSet` for gRPC reflection.

use std::path::PathBuf;

/// Everything except the coordinator contracts, which are behind the
/// `coordinator` feature so shard crates can prove they never link it.
const ALWAYS: &[&str] = &[
    "bigfleet/v1alpha1/capacity.proto",
    "bigfleet/v1alpha1/provider.proto",
    "bigfleet/v1alpha1/shard.proto",
    "bigfleet/v1alpha1/shardread.proto",
    "bigfleet/mesh/v1/decide.proto",
    "bigfleet/mesh/v1/gateway.proto",
    "bigfleet/mesh/v1/raft.proto",
    "bigfleet/mesh/v1/inspect.proto",
];
const COORDINATOR: &[&str] = &[
    "bigfleet/v1alpha1/coordinator.proto",
    "bigfleet/mesh/v1/coordinator.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut protos: Vec<&str> = ALWAYS.to_vec();
    if std::env::var_os("CARGO_FEATURE_COORDINATOR").is_some() {
        protos.extend_from_slice(COORDINATOR);
    }
    tonic_prost_build::configure()
        // Machine records are decoded by the hundred thousand (reconcile) and
        // land in the model's ordered maps: ordered maps on the wire side too
        // skip a SipHash table per record and keep `shard_metadata` ordered
        // end to end (ADR-0031).
        .btree_map(".bigfleet.v1alpha1.Machine.labels")
        .btree_map(".bigfleet.v1alpha1.Machine.shard_metadata")
        .btree_map(".bigfleet.v1alpha1.ConfigureRequest.shard_metadata")
        .btree_map(".bigfleet.v1alpha1.Resources.resources")
        .build_client(true)
        .build_server(true)
        .file_descriptor_set_path(out.join("bigfleet_descriptor.bin"))
        .compile_protos(&protos, &["."])?;
    // New files (not only edits of compiled ones) must trigger a rebuild.
    println!("cargo:rerun-if-changed=bigfleet");
    Ok(())
}
