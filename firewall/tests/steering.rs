//! Steering: the words around a secret are the response's own, so whoever steers the
//! response (a prompt injection, a poisoned document) writes them. They may talk the generic
//! rules out of calling a value a secret (the judge reads them, so do `allow_line`
//! exemptions), but never hide another tenant's secret from its owner: a value the rules
//! found as a secret in one tenant's prompt blocks in any other tenant's response, however
//! the response words it, streamed or not.
// A rule set that does not load fails the test: panicking is how tests fail.
#![allow(clippy::panic)]

mod common;

use std::sync::Arc;

use common::*;
use firewall::{secret_fingerprints, Action, Detail, Detectors, Finding, Ruleset, ScanContext};

/// A password weak enough for wording to matter: the judge takes it in a config line and
/// may turn it down in prose.
const PASSWORD: &str = "Kx9-apple-river";

/// How acme's prompt holds it: a plain config line.
const PROMPT: &str = "DB_PASSWORD = \"Kx9-apple-river\"";

/// Wordings a steered response may use around the same value.
const WORDINGS: &[&str] = &[
    "The example below shows the id, url and version fields: password = \"{}\"",
    "version id url name title: password = \"{}\"",
    "In this tutorial we set a sample value, e.g. pwd = \"{}\", then print the version id.",
    "example_password = \"{}\"  # placeholder",
    "// lorem ipsum dolor sit amet example placeholder text: password = \"{}\"",
    // Inside an API description's example, which `api-description-examples` exempts.
    "{\"example\":{\"login\":\"ops\",\"password\":\"{}\"}}",
];

/// Detectors whose ownership index holds acme's prompt, recorded as the gateway records it.
fn owned_by_acme(rules: &Ruleset) -> Arc<Detectors> {
    let hashes = secret_fingerprints(rules, PROMPT, &HASH_KEY);
    assert!(!hashes.is_empty(), "the rules find no secret in acme's prompt {PROMPT:?}");
    secrets_owned_by(rules, "acme", PROMPT)
}

/// Whether `found` blocks the response for a secret acme owns.
fn blocked_as_acmes(found: &[Finding]) -> bool {
    found.iter().any(|f| {
        f.action == Action::Block && matches!(&f.detail, Detail::Foreign { owners, .. } if owners == &["acme"])
    })
}

#[test]
fn wording_cannot_hide_another_tenants_secret() {
    let rules = builtin();
    let det = owned_by_acme(&rules);
    let globex = ScanContext::new("globex");
    let mut steered = 0;
    for wording in WORDINGS {
        let text = wording.replace("{}", PASSWORD);
        let at = text.find(PASSWORD).unwrap_or(0);
        let plain = rules.scan(&text);
        if plain.iter().any(|f| f.start <= at && at < f.end) {
            continue;
        }
        // The rules alone let this wording through: only ownership stands in the way.
        steered += 1;
        let found = rules.scan_with(&text, &globex, &det);
        assert!(blocked_as_acmes(&found), "acme's password worded as {text:?} was not blocked: {found:?}");
        let s = stream(&rules, &globex, &det, &text, &char_cuts(&text));
        assert!(s.blocked, "streamed: {text:?}");
        assert!(!s.released.contains("Kx9-apple"), "released {:?} of {text:?}", s.released);
        check_chunking(&rules, &globex, &det, &text, &char_cuts(&text));

        // The owner's own value, worded the same, comes back to it untouched, and so does
        // any value nobody owns: the rules let the wording through, and so does ownership.
        let s = stream(&rules, &ScanContext::new("acme"), &det, &text, &char_cuts(&text));
        assert!(!s.blocked && s.released == text && s.findings.is_empty(), "acme's own: {s:?}");
        let unknown = text.replace(PASSWORD, "Qz4-lemon-stone");
        let s = stream(&rules, &globex, &det, &unknown, &char_cuts(&unknown));
        assert!(!s.blocked && s.released == unknown, "nobody's value: {s:?}");
    }
    // Proves something only while some wording does steer the rules; a retrained judge
    // that takes every one of them needs new wordings here, not a weaker test.
    assert!(steered > 0, "no wording steered the built-in rules away from {PASSWORD:?}");
}

#[test]
fn a_secret_its_owner_worded_weakly_is_still_owned() {
    let rules = builtin();
    let globex = ScanContext::new("globex");
    // The wordings that talk the built-in rules out of the password.
    let steering: Vec<String> = WORDINGS
        .iter()
        .map(|w| w.replace("{}", PASSWORD))
        .filter(|text| {
            let at = text.find(PASSWORD).unwrap_or(0);
            !rules.scan(text).iter().any(|f| f.start <= at && at < f.end)
        })
        .collect();
    assert!(steering.len() >= 2, "fewer than two wordings steer the built-in rules: {steering:?}");
    // acme's prompt words its password one way, globex's response another.
    let (prompt, response) = (&steering[0], &steering[1]);
    let det = secrets_owned_by(&rules, "acme", prompt);
    let found = rules.scan_with(response, &globex, &det);
    assert!(blocked_as_acmes(&found), "acme's password, sent as {prompt:?}, reached globex as {response:?}: {found:?}");
    let s = stream(&rules, &globex, &det, response, &char_cuts(response));
    assert!(s.blocked && !s.released.contains("Kx9-apple"), "streamed: {s:?}");
    // The owner gets it back, and a value nobody sent still passes.
    let s = stream(&rules, &ScanContext::new("acme"), &det, response, &char_cuts(response));
    assert!(!s.blocked && s.released == *response, "acme's own: {s:?}");
    let unknown = response.replace(PASSWORD, "Qz4-lemon-stone");
    assert!(rules.scan_with(&unknown, &globex, &det).is_empty(), "nobody's value: {unknown:?}");
}

#[test]
fn an_allow_line_exemption_hides_no_foreign_secret() {
    let rules = match Ruleset::load_sources(
        &[firewall::RuleSource::new(
            "r.toml",
            r#"
[[rule]]
id = "demo-pass"
description = "demo"
severity = "high"
action = "redact"
regex = '''pass=([a-z0-9]{10})'''
secret_group = 1
keywords = ["pass="]
allow_line = ['''(?i)example''']
"#,
        )],
        firewall::LoadOptions::default(),
    ) {
        Ok(r) => Arc::new(r),
        Err(e) => panic!("{e}"),
    };
    let det = secrets_owned_by(&rules, "acme", "pass=k3y9s3cr3t");
    let text = "for example pass=k3y9s3cr3t";
    assert!(rules.scan(text).is_empty(), "the exemption applies without ownership");
    let found = rules.scan_with(text, &ScanContext::new("globex"), &det);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].action, Action::Block);
    assert!(rules.scan_with(text, &ScanContext::new("acme"), &det).is_empty(), "own: exempt as before");
    assert!(
        rules.scan_with("for example pass=zzzzzzzzzz", &ScanContext::new("globex"), &det).is_empty(),
        "nobody's: exempt as before"
    );
    for cuts in [char_cuts(text), vec![5], vec![17, 20]] {
        check_chunking(&rules, &ScanContext::new("globex"), &det, text, &cuts);
    }
}

/// `allow_repeated_user` reads the user name before the password, and the response writes
/// that name: a steered response that writes another tenant's password as its own user name
/// (`orchidvalley:orchidvalley`) talks the URL rule out of it, but not the owner.
#[test]
fn a_password_written_as_its_own_user_name_is_still_owned() {
    let rules = builtin();
    let prompt = "DATABASE_URL=postgres://svc:orchidvalley@db.internal/app";
    let det = secrets_owned_by(&rules, "acme", prompt);
    assert!(!rules.scan(prompt).is_empty(), "the URL rule finds acme's password in its prompt");
    let response = "Connect with postgres://orchidvalley:orchidvalley@db.internal/app and run the migration.";
    assert!(rules.scan(response).is_empty(), "the name before it exempts the password without ownership");
    let globex = ScanContext::new("globex");
    let found = rules.scan_with(response, &globex, &det);
    assert!(blocked_as_acmes(&found), "acme's password reached globex as {response:?}: {found:?}");
    let s = stream(&rules, &globex, &det, response, &char_cuts(response));
    assert!(s.blocked && !s.released.contains("orchidvalley"), "streamed: {s:?}");
    check_chunking(&rules, &globex, &det, response, &char_cuts(response));
    // The owner gets it back, and a user's default password nobody sent still passes.
    let s = stream(&rules, &ScanContext::new("acme"), &det, response, &char_cuts(response));
    assert!(!s.blocked && s.released == response, "acme's own: {s:?}");
    let unknown = response.replace("orchidvalley", "lemonstone");
    assert!(rules.scan_with(&unknown, &globex, &det).is_empty(), "nobody's value: {unknown:?}");
}
