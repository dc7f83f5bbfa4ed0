//! The `rules` and `scan` command functions (what `crossguard rules …` and `crossguard scan`
//! run), called directly: exit codes on good and bad rule folders, inputs and gitleaks files.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use gateway::commands::{rules, scan};

/// One rule with samples that pass, in a folder of its own.
const RULE: &str = r#"
[[rule]]
id = "demo-block-key"
description = "A fixed-shape key that blocks"
severity = "critical"
action = "block"
regex = '''\b(dbk_[A-Za-z0-9]{20})\b'''
secret_group = 1
keywords = ["dbk_"]
min_entropy = 3.0
must_match = ["token dbk_Q2w3E4r5T6y7U8i9O0pA here"]
must_not_match = ["dbk_aaaaaaaaaaaaaaaaaaaa"]
"#;

fn rules_dir(dir: &Path, text: &str) -> PathBuf {
    let folder = dir.join("rules");
    let _ = std::fs::create_dir_all(&folder);
    let _ = std::fs::write(folder.join("demo.toml"), text);
    folder
}

#[test]
fn rules_check_and_test_pass_on_good_rules_and_the_builtin_ones() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let good = rules_dir(dir.path(), RULE);
    assert_eq!(rules::check(&good), ExitCode::SUCCESS);
    assert_eq!(rules::test(&good), ExitCode::SUCCESS);
    // An empty path checks the rules built into the binary.
    assert_eq!(rules::check(Path::new("")), ExitCode::SUCCESS);
}

#[test]
fn rules_check_and_test_fail_on_a_bad_folder() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let bad = rules_dir(dir.path(), "[[rule]]\nid = 'x'\n");
    assert_eq!(rules::check(&bad), ExitCode::from(1));
    assert_eq!(rules::test(&bad), ExitCode::from(1));
    let failing_sample = rules_dir(dir.path(), &RULE.replace("dbk_aaaaaaaaaaaaaaaaaaaa", "dbk_Q2w3E4r5T6y7U8i9O0pB"));
    assert_eq!(rules::test(&failing_sample), ExitCode::from(1));
}

#[test]
fn scan_exit_codes() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let rules = Some(rules_dir(dir.path(), RULE));
    let clean = dir.path().join("clean.txt");
    let dirty = dir.path().join("dirty.jsonl");
    let _ = std::fs::write(&clean, "nothing here\n");
    let _ = std::fs::write(
        &dirty,
        "{\"id\":7,\"text\":\"k dbk_Q2w3E4r5T6y7U8i9O0pA\"}\n\n{\"id\":\"b\",\"text\":\"clean\"}\n",
    );
    let args = |files: Vec<PathBuf>, input_jsonl: Option<PathBuf>| scan::ScanArgs {
        rules: rules.clone(),
        files,
        input_jsonl,
        read_encoded: false,
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
