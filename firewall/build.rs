//! Embeds the repository's default rules (`../rules/*.toml`) into the crate, so the binary
//! carries its ruleset. Re-runs when the folder or any rule file changes. A folder that
//! cannot be read or holds no rule file fails the build: a firewall built without its
//! rules would pass every response.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let dir = manifest.join("..").join("rules");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => {
            rd.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "toml")).collect()
        }
        Err(e) => fail(&format!("cannot read the default rules folder {}: {e}", dir.display())),
    };
    if files.is_empty() {
        fail(&format!("the default rules folder {} holds no *.toml rule file", dir.display()));
    }
    files.sort();
    let mut src = String::from(
        "/// `(file name, contents)` of every default rule file.\npub(crate) static FILES: &[(&str, &str)] = &[\n",
    );
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let _ = writeln!(src, "    ({name:?}, include_str!({:?})),", f.display().to_string());
    }
    src.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into())).join("builtin_rules.rs");
    if let Err(e) = std::fs::write(&out, src) {
        fail(&format!("cannot write {}: {e}", out.display()));
    }
}

/// Stops the build with `message` (cargo shows a build script's stderr when it fails).
fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1)
}
