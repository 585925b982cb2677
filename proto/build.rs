//! Compiles the protos with a vendored protoc so a fresh machine needs no
//! system protobuf compiler.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto");
    // The descriptor set lets tests check hand-written codecs (the Python
    // client's) against the .proto files.
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("sluice_descriptor_set.bin");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .file_descriptor_set_path(descriptors)
        // prost's codec, with a received message's repeated entries counted
        // before it is decoded (src/counted_codec.rs).
        .codec_path("crate::counted_codec::CountedCodec")
        .compile_protos(
            &["proto/sluice/common.proto", "proto/sluice/agent.proto", "proto/sluice/shim.proto"],
            &["proto"],
        )?;
    Ok(())
}
