fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("bigfleet_descriptor.bin"))
        .compile_protos(&["bigfleet/v1alpha1/capacity.proto"], &["."])?;
    println!("cargo:rerun-if-changed=bigfleet");
    Ok(())
}
