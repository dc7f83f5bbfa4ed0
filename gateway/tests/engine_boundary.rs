//! The gateway reaches the engine through the names its crate root re-exports, never
//! through the engine's modules: what the engine keeps inside a module may move without
//! touching the gateway (see ARCHITECTURE.md, "Crates").
#![allow(clippy::panic)] // a test: an unreadable source should stop it loudly

use std::fs;
use std::path::{Path, PathBuf};

/// The engine's public modules, read from its `lib.rs` (`pub mod NAME;`).
fn engine_modules() -> Vec<String> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/src/lib.rs");
    let text = fs::read_to_string(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    text.lines().filter_map(|l| l.trim().strip_prefix("pub mod ")?.strip_suffix(';').map(str::to_owned)).collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Whether `line` names `engine::MODULE::` as the engine crate (not a path that merely ends
/// in a segment called `engine`, like `backend::engine::`).
fn names_engine_module(line: &str, module: &str) -> bool {
    let needle = format!("engine::{module}::");
    line.match_indices(&needle).any(|(at, _)| {
        // `::engine::…` is the crate too; `x::engine::…` or `my_engine::…` is not.
        let before = &line[..at];
        let before = before.strip_suffix("::").unwrap_or(before);
        !before.chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn the_gateway_imports_the_engine_only_through_its_root() {
    let modules = engine_modules();
    assert!(modules.iter().any(|m| m == "kv"), "no modules read from engine/src/lib.rs: {modules:?}");
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    let mut found = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (n, line) in text.lines().enumerate() {
            for module in &modules {
                if names_engine_module(line, module) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "engine modules named by the gateway (use the root re-exports):\n{}", found.join("\n"));
}

#[test]
fn the_check_tells_the_crate_from_a_segment_named_engine() {
    assert!(names_engine_module("use engine::kv::Owner;", "kv"));
    assert!(names_engine_module("    pub fn kv_stats(&self) -> Option<::engine::kv::KvStats> {", "kv"));
    assert!(names_engine_module("(engine::sched::SchedulerConfig::default())", "sched"));
    assert!(!names_engine_module("use crate::backend::engine::kv::Thing;", "kv"));
    assert!(!names_engine_module("use super::engine::kv::Thing;", "kv"));
    assert!(!names_engine_module("my_engine::kv::x", "kv"));
    assert!(!names_engine_module("use engine::Owner;", "kv"));
}
