//! Link directives only: the bindings themselves are generated ahead of time by `generate.sh` and
//! committed as `src/bindings.rs`, so building this crate needs no libclang.
//!
//! Where libkfuse.so is looked for: `$KFUSE_LIB_DIR` if set, else the repository's own build tree
//! `build/main` (this crate lives at `bindings/rust/kfuse-sys`). The directory is
//!  - passed to the linker (`-L`, `-lkfuse`),
//!  - written as an rpath into this crate's own test binaries (the bindgen layout tests),
//!  - published to dependent build scripts as `DEP_KFUSE_LIB_DIR` (`links = "kfuse"`), which the
//!    `kfuse` crate uses for the rpath of its tests and examples,
//!  - and mirrored by a symlink directory inside OUT_DIR, because cargo puts link-search paths that
//!    lie inside the target directory on the dynamic loader's path for everything it runs
//!    (`cargo test`, `cargo run`, doc tests), which covers the doc tests (rustdoc takes no rpath).
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=KFUSE_LIB_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dir = match env::var_os("KFUSE_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => manifest.join("../../../build/main"),
    };
    let dir = fs::canonicalize(&dir).unwrap_or(dir);
    let so = dir.join("libkfuse.so");
    if !so.exists() {
        println!(
            "cargo:warning=kfuse-sys: {} not found; build the C library first (cmake -S . -B build/main && \
             cmake --build build/main) or set KFUSE_LIB_DIR",
            so.display()
        );
    }
    println!("cargo:rerun-if-changed={}", so.display());

    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=kfuse");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    println!("cargo:lib_dir={}", dir.display());

    // The loader-path mirror inside OUT_DIR (see above). Failing to make it only costs the
    // automatic loader path, so it is not an error.
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("kfuse-lib");
    let _ = fs::remove_dir_all(&out);
    if fs::create_dir_all(&out).is_ok() {
        #[cfg(unix)]
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("libkfuse.so") {
                    let _ = std::os::unix::fs::symlink(e.path(), out.join(&name));
                }
            }
        }
        println!("cargo:rustc-link-search=native={}", out.display());
    }
}
