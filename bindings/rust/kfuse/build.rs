//! Writes the rpath of libkfuse (found by kfuse-sys, published as DEP_KFUSE_LIB_DIR through its
//! `links = "kfuse"` key) into this crate's tests, examples and benches, so that they run
//! directly from target/ without LD_LIBRARY_PATH.
fn main() {
    if let Ok(dir) = std::env::var("DEP_KFUSE_LIB_DIR") {
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
        println!("cargo:rustc-link-arg-examples=-Wl,-rpath,{dir}");
    }
}
