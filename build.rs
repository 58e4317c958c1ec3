//! Which parts of this machine the tests lack (`tests/parts`), as `cfg(missing = "NAME")`: a
//! test that needs a missing part is then built with `#[ignore = "why"]`, and `cargo test`
//! counts it as ignored and says why, instead of counting a test that returned early as passed.
//!
//! The tests alone need this, and cargo builds the crate with `fault-injection` exactly when it
//! builds them (the dev-dependency on itself): a build without that feature (`cargo build`,
//! `cargo install`) looks at nothing and is never rebuilt for a change of the machine.

#[path = "tests/parts/mod.rs"]
mod parts;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=tests/parts/mod.rs");
    let names: Vec<String> = parts::Part::ALL
        .iter()
        .map(|part| format!("\"{}\"", part.name()))
        .collect();
    println!(
        "cargo::rustc-check-cfg=cfg(missing, values({}))",
        names.join(", ")
    );
    release_link_args();
    if std::env::var_os("CARGO_FEATURE_FAULT_INJECTION").is_none() {
        return;
    }
    // Under CI a missing part fails the tests that need it: none is ignored.
    println!("cargo::rerun-if-env-changed=CI");
    if parts::ci() {
        return;
    }
    for var in ["PATH", "PG_BIN"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    // Only folders that exist: while a path it watches does not exist, cargo runs the script
    // again, and rebuilds the crate, on every build. Cargo reads each folder on every build:
    // PATH's are flat, /usr/lib/postgresql is small.
    for dir in parts::watched() {
        println!("cargo::rerun-if-changed={}", dir.display());
    }
    for part in parts::Part::ALL {
        if part.find().is_err() {
            println!("cargo::rustc-cfg=missing=\"{}\"", part.name());
        }
    }
}

/// The release binary keeps its line tables, so that a backtrace names the file and line of each
/// frame, and its linker compresses them (zlib): 114 MB uncompressed, 52 MB compressed, where
/// stripping them altogether would leave 28 MB and backtraces without lines. The standard
/// library's backtrace reads compressed sections. GNU ld, gold, lld and mold all take the flag;
/// other systems' linkers are left alone. `cargo install` builds this profile.
fn release_link_args() {
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if release && linux {
        println!("cargo::rustc-link-arg-bins=-Wl,--compress-debug-sections=zlib");
    }
}
