//! Any bytes as a rule file: loading may refuse, never panic.
#![no_main]

use firewall::{LoadOptions, Ruleset};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let sources = [("fuzz.toml".to_string(), text.to_string())];
        if let Ok(set) = Ruleset::load_sources(&sources, LoadOptions::default()) {
            let _ = set.run_samples();
        }
        let _ = firewall::gitleaks::import(text);
    }
});
