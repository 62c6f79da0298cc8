//! Link directives only: the bindings themselves are generated ahead of time by `generate.sh` and
//! committed as `src/bindings.rs`, so building this crate needs no libclang.
//!
//! Where libkfuse comes from, the first that applies:
//!  1. `$KFUSE_LIB_DIR`, a directory holding libkfuse.so (a development build tree:
//!     scripts/test-rust.sh sets the repository's build/main). With the `static` feature it must
//!     hold libkfuse.a and `pkgconfig/kfuse.pc` (an install's lib directory), which names what the
//!     archive needs.
//!  2. pkg-config, when it knows `kfuse` (an install; PKG_CONFIG_PATH is honoured): `--libs`, or
//!     `--static --libs` with the `static` feature (Libs.private: OpenBLAS, libgfortran, OpenMP, and
//!     in a CUDA build cuBLAS and the CUDA runtime).
//!  3. Otherwise the C library is built from the checkout this crate sits in with CMake, installed
//!     into OUT_DIR and used as in 2. `$KFUSE_CMAKE_ARGS` adds CMake options (e.g. `-DKF_CUDA=OFF`).
//!
//! With the shared library the directory is
//!  - written as an rpath into this crate's own test binaries (the bindgen layout tests),
//!  - published to dependent build scripts as `DEP_KFUSE_LIB_DIR` (`links = "kfuse"`): the `kfuse`
//!    crate writes it as an rpath into its tests and examples, and a binary crate that depends on
//!    `kfuse-sys` can do the same in a one-line build script. Cargo lets no library crate put an
//!    rpath into a downstream binary; the `static` feature needs none,
//!  - and mirrored by a symlink directory inside OUT_DIR, because cargo puts link-search paths
//!    inside the target directory on the loader path of everything it runs (`cargo test`,
//!    `cargo run`, doc tests, which take no rpath).
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for v in ["KFUSE_LIB_DIR", "KFUSE_CMAKE_ARGS", "PKG_CONFIG_PATH"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    let statik = env::var_os("CARGO_FEATURE_STATIC").is_some();
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));

    let libs = if let Some(dir) = env::var_os("KFUSE_LIB_DIR").filter(|d| !d.is_empty()) {
        let dir = fs::canonicalize(&dir).unwrap_or_else(|_| PathBuf::from(dir));
        if statik {
            let pc = dir.join("pkgconfig");
            pkg_config_libs(Some(&pc), true)
                .unwrap_or_else(|e| panic!("kfuse-sys (static, KFUSE_LIB_DIR={}): {e}", dir.display()))
        } else {
            if !dir.join("libkfuse.so").exists() {
                println!("cargo:warning=kfuse-sys: no libkfuse.so in KFUSE_LIB_DIR={}", dir.display());
            }
            println!("cargo:rerun-if-changed={}", dir.join("libkfuse.so").display());
            vec![Item::Search(dir), Item::Lib("kfuse".into())]
        }
    } else if let Ok(libs) = pkg_config_libs(None, statik) {
        libs
    } else {
        let pc = build_from_source(&out);
        pkg_config_libs(Some(&pc), statik).unwrap_or_else(|e| panic!("kfuse-sys: {e}"))
    };
    emit(&libs, statik, &out);
}

/// One element of a link line: a search directory, a library name (-l), or a library file.
enum Item {
    Search(PathBuf),
    Lib(String),
    File(PathBuf),
}

/// The link line pkg-config gives for kfuse (`pc_dir`: prepended to PKG_CONFIG_PATH).
fn pkg_config_libs(pc_dir: Option<&Path>, statik: bool) -> Result<Vec<Item>, String> {
    let mut cmd = Command::new("pkg-config");
    if let Some(d) = pc_dir {
        let old = env::var("PKG_CONFIG_PATH").unwrap_or_default();
        cmd.env("PKG_CONFIG_PATH", format!("{}:{old}", d.display()));
    }
    if statik {
        cmd.arg("--static");
    }
    let o = cmd.args(["--libs", "kfuse"]).output().map_err(|e| format!("pkg-config: {e}"))?;
    if !o.status.success() {
        return Err(format!("pkg-config --libs kfuse: {}", String::from_utf8_lossy(&o.stderr).trim()));
    }
    let mut items = Vec::new();
    for tok in String::from_utf8_lossy(&o.stdout).split_whitespace() {
        if let Some(d) = tok.strip_prefix("-L") {
            items.push(Item::Search(fs::canonicalize(d).unwrap_or_else(|_| PathBuf::from(d))));
        } else if let Some(l) = tok.strip_prefix("-l") {
            items.push(Item::Lib(l.to_string()));
        } else if tok == "-fopenmp" {
            items.push(Item::Lib("gomp".into())); // gcc's OpenMP runtime, which libkfuse is built with
        } else if tok.starts_with('/') {
            items.push(Item::File(PathBuf::from(tok)));
        }
    }
    Ok(items)
}

/// Builds and installs the C library from this checkout into OUT_DIR; returns its pkgconfig dir.
fn build_from_source(out: &Path) -> PathBuf {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let src = manifest.join("../../..");
    if !src.join("capi/include/kfuse.h").exists() {
        panic!(
            "kfuse-sys: libkfuse not found (KFUSE_LIB_DIR unset, pkg-config knows no kfuse) and \
                no kfuse checkout at {} to build it from",
            src.display()
        );
    }
    for d in ["CMakeLists.txt", "capi", "cpu", "cuda", "common", "cmake"] {
        println!("cargo:rerun-if-changed={}", src.join(d).display());
    }
    let (build, prefix) = (out.join("kfuse-build"), out.join("kfuse-prefix"));
    let extra = env::var("KFUSE_CMAKE_ARGS").unwrap_or_default();
    let run = |args: &[&str]| {
        let st = Command::new("cmake").args(args).status().unwrap_or_else(|e| {
            panic!("kfuse-sys: cannot run cmake to build libkfuse ({e}); install cmake or set KFUSE_LIB_DIR")
        });
        assert!(st.success(), "kfuse-sys: cmake {} failed", args.join(" "));
    };
    let (s, b, p) = (src.display().to_string(), build.display().to_string(), prefix.display().to_string());
    let mut cfg = vec![
        "-S",
        &s,
        "-B",
        &b,
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_INSTALL_LIBDIR=lib",
        "-DKF_BUILD_TESTS=OFF",
        "-DKF_BUILD_EXAMPLES=OFF",
        "-DKF_BUILD_BENCHES=OFF",
    ];
    cfg.extend(extra.split_whitespace());
    run(&cfg);
    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "2".into());
    run(&["--build", &b, "-j", &jobs]);
    run(&["--install", &b, "--prefix", &p]);
    prefix.join("lib/pkgconfig")
}

fn emit(items: &[Item], statik: bool, out: &Path) {
    // Library files named by path (the private static OpenBLAS, libgfortran.so.5) go through a
    // symlink directory under plain names, since `rustc-link-lib` takes names, not paths.
    let links = out.join("kfuse-links");
    let _ = fs::remove_dir_all(&links);
    fs::create_dir_all(&links).expect("OUT_DIR/kfuse-links");
    println!("cargo:rustc-link-search=native={}", links.display());
    let mut lib_dir = None;
    for it in items {
        match it {
            Item::Search(d) => {
                println!("cargo:rustc-link-search=native={}", d.display());
                if d.join("libkfuse.so").exists() || d.join("libkfuse.a").exists() {
                    lib_dir.get_or_insert(d.clone());
                }
            }
            Item::Lib(l) if l == "kfuse" => {
                println!("cargo:rustc-link-lib={}=kfuse", if statik { "static" } else { "dylib" })
            }
            Item::Lib(l) => println!("cargo:rustc-link-lib=dylib={l}"),
            Item::File(f) => {
                let name = f.file_name().unwrap().to_string_lossy().to_string();
                let stem = name.trim_start_matches("lib");
                let (kind, base) = match stem.split_once(".so") {
                    Some((base, _)) => ("dylib", base.to_string()),
                    None => ("static", stem.trim_end_matches(".a").to_string()),
                };
                let ext = if kind == "dylib" { "so" } else { "a" };
                link(f, &links.join(format!("lib{base}.{ext}")));
                println!("cargo:rustc-link-lib={kind}={base}");
            }
        }
    }
    let dir = match lib_dir {
        Some(d) => d,
        None => return,
    };
    println!("cargo:lib_dir={}", dir.display());
    if statik {
        return;
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    // The loader-path mirror inside OUT_DIR (see the top of this file).
    let mirror = out.join("kfuse-lib");
    let _ = fs::remove_dir_all(&mirror);
    if fs::create_dir_all(&mirror).is_ok() {
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("libkfuse.so") {
                    link(&e.path(), &mirror.join(e.file_name()));
                }
            }
        }
        println!("cargo:rustc-link-search=native={}", mirror.display());
    }
}

fn link(target: &Path, at: &Path) {
    #[cfg(unix)]
    std::os::unix::fs::symlink(target, at)
        .unwrap_or_else(|e| panic!("kfuse-sys: symlink {} -> {}: {e}", at.display(), target.display()));
}
