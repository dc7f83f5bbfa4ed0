//! Any bytes as a rule file: loading may refuse, never panic, and a refusal names the file
//! and a line inside it, with a reason.
#![no_main]

use firewall::{LoadOptions, RuleSource, Ruleset};
use libfuzzer_sys::fuzz_target;

const FILE: &str = "fuzz.toml";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let sources = [RuleSource::new(FILE, text)];
    match Ruleset::load_sources(&sources, LoadOptions::default()) {
        Ok(set) => {
            let _ = set.run_samples();
        }
        Err(refused) => {
            assert!(!refused.errors.is_empty(), "a refusal without errors");
            // A line end may sit after the last character; `lines()` does not count it.
            let lines = text.lines().count() + 1;
            for e in &refused.errors {
                assert_eq!(e.file, FILE, "error names the wrong file: {e}");
                assert!(e.line >= 1, "error without a line: {e}");
                assert!(e.line <= lines, "error line {} past the file's {lines} lines: {e}", e.line);
                assert!(!e.reason.trim().is_empty(), "error without a reason: {e}");
            }
        }
    }
    let _ = firewall::import_gitleaks(text);
});
