//! With libkfuse linked dynamically, write its directory (found by kfuse-sys) as an rpath into
//! this binary, so it runs without LD_LIBRARY_PATH: cargo lets no library crate do this for its
//! dependents. Nothing to do with the `static` feature.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_KFUSE_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_STATIC").is_none() {
        if let Ok(dir) = std::env::var("DEP_KFUSE_LIB_DIR") {
            println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
        }
    }
}
