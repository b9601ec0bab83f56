//! Protobuf contracts: the public `bigfleet.v1alpha1` package and the internal `bigfleet.mesh.v1` package.
#![allow(missing_docs)]
pub mod v1alpha1 {
    tonic::include_proto!("bigfleet.v1alpha1");
}
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("bigfleet_descriptor");
