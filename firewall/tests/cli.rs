//! Compiles and exercises the gateway's `rules` and `scan` command functions against the
//! firewall alone (they depend only on `firewall`, std, serde and serde_json).

#[path = "../../gateway/src/commands/rules.rs"]
mod rules;
#[path = "../../gateway/src/commands/scan.rs"]
mod scan;

mod common;

use std::process::ExitCode;

#[test]
fn rules_check_and_test_on_fixtures_and_builtin() {
    assert_eq!(rules::check(&common::fixtures()), ExitCode::SUCCESS);
    assert_eq!(rules::test(&common::fixtures()), ExitCode::SUCCESS);
    assert_eq!(rules::check(std::path::Path::new("")), ExitCode::SUCCESS);
}

#[test]
fn rules_check_fails_on_a_bad_folder() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let _ = std::fs::write(dir.path().join("bad.toml"), "[[rule]]\nid = 'x'\n");
    assert_eq!(rules::check(dir.path()), ExitCode::from(1));
    assert_eq!(rules::test(dir.path()), ExitCode::from(1));
}

#[test]
fn scan_exit_codes() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let clean = dir.path().join("clean.txt");
    let dirty = dir.path().join("dirty.jsonl");
    let _ = std::fs::write(&clean, "nothing here\n");
    let _ = std::fs::write(
        &dirty,
        "{\"id\":7,\"text\":\"k dbk_Q2w3E4r5T6y7U8i9O0pA\"}\n\n{\"id\":\"b\",\"text\":\"clean\"}\n",
    );
    let args = |files: Vec<std::path::PathBuf>, jsonl: Option<std::path::PathBuf>| scan::ScanArgs {
        rules: Some(common::fixtures()),
        files,
        input_jsonl: jsonl,
    };
    assert_eq!(scan::scan(&args(vec![clean.clone()], None)), ExitCode::SUCCESS);
    assert_eq!(scan::scan(&args(vec![clean.clone()], Some(dirty.clone()))), ExitCode::from(1));
    assert_eq!(scan::scan(&args(vec![dir.path().join("missing.txt")], None)), ExitCode::from(2));
    let _ = std::fs::write(&dirty, "{\"text\":1}\n");
    assert_eq!(scan::scan(&args(vec![], Some(dirty))), ExitCode::from(2));
}

#[test]
fn import_gitleaks_exit_codes() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let file = dir.path().join("gitleaks.toml");
    let _ = std::fs::write(
        &file,
        "[[rules]]\nid = \"github-pat\"\nregex = '''ghp_[0-9a-zA-Z]{36}'''\nkeywords = [\"ghp_\"]\n",
    );
    assert_eq!(rules::import_gitleaks(&file), ExitCode::SUCCESS);
    let _ = std::fs::write(&file, "[[rules]\n");
    assert_eq!(rules::import_gitleaks(&file), ExitCode::from(2));
    assert_eq!(rules::import_gitleaks(&dir.path().join("missing.toml")), ExitCode::from(2));
}
