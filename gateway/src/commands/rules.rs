//! `crossguard rules check|test|import-gitleaks`: the security engineer's tools for rule
//! files. Each returns the process exit code; output goes to stdout, problems to stderr.
//! An empty `dir` path means the built-in ruleset.

use std::path::Path;
use std::process::ExitCode;

use firewall::{LoadErrors, LoadOptions, RuleFiles, Ruleset};

fn files(dir: &Path) -> RuleFiles {
    RuleFiles::folder_or_builtin((!dir.as_os_str().is_empty()).then_some(dir))
}

fn load(dir: &Path, opts: LoadOptions) -> Result<Ruleset, LoadErrors> {
    Ruleset::load(&files(dir), &[], opts)
}

fn label(dir: &Path) -> String {
    files(dir).to_string()
}

/// `crossguard rules check [DIR]`: validate everything, samples included; exit 1 listing
/// every error.
pub fn check(dir: &Path) -> ExitCode {
    match load(dir, LoadOptions::default()) {
        Ok(set) => {
            println!("{}: {} rules, {} canaries: ok", label(dir), set.len(), set.canaries().len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprint!("{e}");
            ExitCode::from(1)
        }
    }
}

/// `crossguard rules test [DIR]`: run every sample and report per rule; exit 1 if any
/// sample fails or the files do not load.
pub fn test(dir: &Path) -> ExitCode {
    let set = match load(dir, LoadOptions { check_samples: false, ..LoadOptions::default() }) {
        Ok(s) => s,
        Err(e) => {
            eprint!("{e}");
            return ExitCode::from(1);
        }
    };
    let report = set.run_samples();
    for r in &report.rules {
        if r.failures.is_empty() {
            println!("ok    {} ({} samples)", r.rule_id, r.passed);
        } else {
            println!("FAIL  {} ({} passed, {} failed)", r.rule_id, r.passed, r.failures.len());
            for f in &r.failures {
                println!("      {}:{}: {}", r.file, f.line, f.reason());
            }
        }
    }
    let failing = report.rules.iter().filter(|r| !r.failures.is_empty()).count();
    println!(
        "{}: {} rules, {} samples passed, {} failed ({} rule(s) failing)",
        label(dir),
        report.rules.len(),
        report.passed(),
        report.failed(),
        failing
    );
    if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `crossguard rules import-gitleaks FILE`: our TOML on stdout; what was not converted,
/// and what changed in translation, on stderr. Exit 2 if the file cannot be read or parsed.
pub fn import_gitleaks(file: &Path) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: cannot read: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let imp = match firewall::import_gitleaks(&text) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    print!("{}", imp.toml);
    for n in &imp.skipped {
        eprintln!("not converted: {}: {}", n.rule_id.as_deref().unwrap_or("-"), n.message);
    }
    for n in &imp.notes {
        eprintln!("note: {}: {}", n.rule_id.as_deref().unwrap_or("-"), n.message);
    }
    eprintln!("{} rule(s) converted, {} not converted", imp.converted, imp.skipped.len());
    ExitCode::SUCCESS
}
