//! Writes the rpath of libkfuse (found by kfuse-sys, see its build.rs; published
//! as DEP_KFUSE_LIB_DIR through its `links = "kfuse"` key) into the bench binaries, so that they
//! also run directly from target/ without LD_LIBRARY_PATH.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_KFUSE_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_KFUSE_LIB_DIR") {
        println!("cargo:rustc-link-arg-benches=-Wl,-rpath,{dir}");
    }
}
