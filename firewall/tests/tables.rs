//! Credentials in tables and in name/value pairs: a cell under a `Password` (`API key`,
//! `Token`...) header is read as `Password: <cell>`, and a `value` after a credential's
//! `name` (`- name: DB_PASSWORD` / `value: ...`) as `DB_PASSWORD: <value>`, one-shot and
//! streamed alike; a stream holds each row of such a table, and each line while a name
//! waits for its value, until it is read, so no byte of a blocked value goes out.

mod common;

use std::sync::Arc;

use common::*;
use firewall::{Action, Detectors, Ruleset, ScanContext, StreamScanner};

const ACCOUNTS: &str = "Here are the accounts:\n\n| Service | Host | User | Password |\n|---------|------|------|----------|\n| Postgres | db.internal | app_rw | Kq8Wz3Tv6Lx2 |\n| Redis | cache.internal | default | Zt7Wq2Kv9Lx4 |\n\nRotate them monthly.";

#[test]
fn a_password_column_is_found_cell_by_cell() {
    let rules = builtin();
    let found = rules.scan(ACCOUNTS);
    for secret in ["Kq8Wz3Tv6Lx2", "Zt7Wq2Kv9Lx4"] {
        let at = ACCOUNTS.find(secret).unwrap_or(0);
        let row = ACCOUNTS[..at].rfind('\n').map_or(0, |nl| nl + 1);
        let f = found.iter().find(|f| (f.start, f.end) == (at, at + secret.len()));
        assert!(f.is_some_and(|f| f.action == Action::Block && f.match_start == row), "{secret}: {found:?}");
    }
    // The same rows without the header naming the column are not read.
    let unnamed = ACCOUNTS.replace("| Password |", "| Notes |");
    assert!(rules.scan(&unnamed).is_empty(), "{:?}", rules.scan(&unnamed));
}

#[test]
fn other_tables_and_made_up_values_stay_quiet() {
    let rules = builtin();
    for text in [
        "| Setting | Token name | Scope |\n|---|---|---|\n| CI | deploy-bot | repo |\n",
        "| User | Password |\n|---|---|\n| admin | `<your password>` |\n| demo | changeme |\n| guest | ******** |\n| ops | N/A |\n",
        "| Variable | API key |\n|---|---|\n| prod | `$STRIPE_KEY` |\n| dev | (see vault) |\n",
        "| Key | Description |\n|---|---|\n| timeout_seconds | How long to wait |\n",
    ] {
        let found = rules.scan(text);
        assert!(found.is_empty(), "{text:?}: {found:?}");
    }
}

#[test]
fn a_provider_token_in_a_credential_column_is_reported_once_per_rule() {
    let rules = builtin();
    let text = "| Name | API Key |\n| --- | --- |\n| Stripe | rk_live_51Hq8Wz3Tv6Lx2Kq8Wz3Tv6Lx2 |\n";
    let found = rules.scan(text);
    let stripe = found.iter().filter(|f| f.rule_id.starts_with("stripe")).count();
    assert_eq!(stripe, 1, "{found:?}");
}

/// Streamed in pieces of every size, a table gives the one-shot findings and releases the
/// text before the first blocked row, and never any byte of it.
#[test]
fn a_streamed_table_blocks_before_the_row_goes_out() {
    let rules = builtin();
    let (ctx, det) = (ScanContext::anonymous(), Arc::new(Detectors::default()));
    check_blocks_in_every_chunking(&rules, &ctx, &det, ACCOUNTS, &[2, 3, 5, 7, 16, 40], "| Postgres");
}

const EXPORT: &str = "Exported 2 users:\n\nusername,email,password\nalice,alice@corp.example,Kq8Wz3Tv6Lx2\nbob,bob@corp.example,\"Zt7Wq2Kv9Lx4\"\n\nImport it with the admin tool.";

/// What DuckDB's shell prints for a query (box-drawn, a type row under the names).
const DUCKDB: &str = "D SELECT name, password FROM users;\n┌─────────┬──────────────┐\n│  name   │   password   │\n│ varchar │   varchar    │\n├─────────┼──────────────┤\n│ alice   │ Kq8Wz3Tv6Lx2 │\n│ bob     │ Zt7Wq2Kv9Lx4 │\n└─────────┴──────────────┘\n";

/// A spreadsheet's export where the decimal separator is a comma.
const SEMICOLONS: &str =
    "Benutzer;E-Mail;Passwort\nalice;alice@corp.example;Kq8Wz3Tv6Lx2\nbob;bob@corp.example;Zt7Wq2Kv9Lx4\n";

/// A CSV export, a box-drawn query result and a semicolon export block one-shot, and in a
/// stream before any byte of their first row goes out.
#[test]
fn exports_and_query_results_block_before_their_rows_go_out() {
    let rules = builtin();
    for text in [EXPORT, DUCKDB, SEMICOLONS] {
        let found = rules.scan(text);
        for secret in ["Kq8Wz3Tv6Lx2", "Zt7Wq2Kv9Lx4"] {
            let at = text.find(secret).unwrap_or(0);
            assert!(found.iter().any(|f| f.start == at && f.action == Action::Block), "{secret}: {found:?}");
        }
        let (ctx, det) = (ScanContext::anonymous(), Arc::new(Detectors::default()));
        check_blocks_in_every_chunking(&rules, &ctx, &det, text, &[3, 7, 16], "alice");
    }
}

/// A table cell settles like any finding: acme's password in a table goes back to acme,
/// and blocks in globex's answer.
#[test]
fn a_tenants_own_password_in_a_table_is_no_leak_and_anothers_is() {
    let rules = builtin();
    let det = secrets_owned_by(&rules, "acme", "DB_PASSWORD = \"Kq8Wz3Tv6Lx2\"");
    let text = "| Service | Password |\n|---|---|\n| Postgres | Kq8Wz3Tv6Lx2 |\n";
    let at = text.find("Kq8").unwrap_or(0);
    let cell = |ctx: &ScanContext| {
        rules.scan_with(text, ctx, &det).into_iter().filter(|f| f.start == at).map(|f| f.action).max()
    };
    assert_ne!(cell(&ScanContext::new("acme")), Some(Action::Block));
    assert_eq!(cell(&ScanContext::new("globex")), Some(Action::Block));
    let s = stream(&rules, &ScanContext::new("globex"), &det, text, &char_cuts(text));
    assert!(s.blocked && !s.released.contains("Kq8"), "{:?}", s.released);
    // A header worded as about the credential makes its cells candidates only: an unknown
    // value passes, another tenant's still blocks.
    let steered = "| Service | Token name |\n|---|---|\n| Postgres | Kq8Wz3Tv6Lx2 |\n| Redis | Zt7Wq2Kv9Lx4 |\n";
    let globex = rules.scan_with(steered, &ScanContext::new("globex"), &det);
    let at = steered.find("Kq8").unwrap_or(0);
    assert!(globex.iter().any(|f| f.start == at && f.action == Action::Block), "{globex:?}");
    assert!(globex.iter().all(|f| f.start == at), "{globex:?}");
}

/// Streams `json` as a tool call's arguments, `size` bytes a push.
fn stream_arguments(rules: &Arc<Ruleset>, json: &str, size: usize) -> Streamed {
    let s = StreamScanner::new(rules.clone(), ScanContext::anonymous(), Arc::new(Detectors::default()));
    let cuts = cuts_every(json, size);
    stream_through(s.decode_json_strings(), json, &cuts)
}

/// A table written into a tool call's arguments (a file an agent writes) is read after JSON
/// decoding, its line breaks being escapes: the password blocks before any of it goes out,
/// and the finding lies over the raw characters that spell it, escapes included.
#[test]
fn a_table_in_tool_call_arguments_is_read_after_json_decoding() {
    let rules = builtin();
    for (json, secret) in [
        (
            r#"{"path": "accounts.md", "content": "| Service | User | Password |\n|---|---|---|\n| db | app_rw | Kq8Wz3Tv6Lx2 |\n"}"#,
            "Kq8Wz3Tv6Lx2",
        ),
        (r#"{"content": "username,password\nalice,Kq8\u0057z3Tv6Lx2\n"}"#, r"Kq8\u0057z3Tv6Lx2"),
    ] {
        let at = json.find(secret).unwrap_or(0);
        for size in [1, 3, 8, 64] {
            let Streamed { released, blocked, findings: found, .. } = stream_arguments(&rules, json, size);
            assert!(blocked, "{size}: {json}");
            assert!(!released.contains("Kq8"), "{size}: {released:?}");
            assert!(
                found.iter().any(|f| (f.start, f.end) == (at, at + secret.len()) && f.action == Action::Block),
                "{size}: {found:?}"
            );
        }
    }
    // The same characters outside a string are JSON, not a table.
    let quiet =
        stream_arguments(&rules, r#"{"Password": 1, "rows": ["x", "y"], "a|b": "|---|", "c": "Kq8Wz3Tv6Lx2"}"#, 4);
    assert!(!quiet.blocked, "{:?}", quiet.findings);
}

/// A Kubernetes manifest's env list and an SSM parameter as the AWS CLI prints it.
const MANIFEST: &str = "containers:\n  - name: api\n    env:\n      - name: LOG_LEVEL\n        value: info\n      - name: DB_PASSWORD\n        value: Kq8Wz3Tv6Lx2\n      - name: PORT\n        value: \"8080\"\n";
/// Maven's settings.xml: the password is an element's text.
const SETTINGS: &str = "<settings>\n  <servers>\n    <server>\n      <id>nexus</id>\n      <username>deploy</username>\n      <password>Tq4vL9xWm2sKd7</password>\n    </server>\n  </servers>\n</settings>\n";
const PARAMETER: &str = "{\"Parameter\": {\"Name\": \"/prod/api/token\", \"Type\": \"SecureString\", \"Value\": \"Zt7Wq2Kv9Lx4Mv4Kq9\", \"Version\": 3}}\nDone.";

/// A value named by another field, or by its element, blocks one-shot, and in a stream
/// before any byte of it goes out, whether the name is on the line before (YAML) or on the
/// same line (JSON, XML).
#[test]
fn a_value_named_by_another_field_blocks_before_it_goes_out() {
    let rules = builtin();
    let (ctx, det) = (ScanContext::anonymous(), Arc::new(Detectors::default()));
    for (text, secret) in [(MANIFEST, "Kq8Wz3Tv6Lx2"), (PARAMETER, "Zt7Wq2Kv9Lx4Mv4Kq9"), (SETTINGS, "Tq4vL9xWm2sKd7")]
    {
        let found = rules.scan(text);
        let at = text.find(secret).unwrap_or(0);
        assert!(
            found.iter().any(|f| (f.start, f.end) == (at, at + secret.len()) && f.action == Action::Block),
            "{secret}: {found:?}"
        );
        assert!(found.iter().all(|f| f.start == at), "only the named value: {found:?}");
        check_blocks_in_every_chunking(&rules, &ctx, &det, text, &[1, 3, 7, 16], &secret[..2]);
    }
    // The same values named as nothing secret pass.
    let plain = MANIFEST.replace("DB_PASSWORD", "DB_HOST");
    assert!(rules.scan(&plain).is_empty(), "{:?}", rules.scan(&plain));
}

/// A tool call whose own arguments are a name/value pair (`set_secret(name, value)`) is read
/// as one: its fields are JSON, not strings the decoded reader sees.
#[test]
fn tool_call_arguments_that_name_a_value_are_read_as_a_pair() {
    let rules = builtin();
    for json in [
        r#"{"name": "DB_PASSWORD", "value": "Kq8Wz3Tv6Lx2"}"#,
        "{\n  \"repo\": \"app\",\n  \"secret_name\": \"DEPLOY_TOKEN\",\n  \"plaintext_value\": \"Kq8Wz3Tv6Lx2\"\n}",
    ] {
        let at = json.find("Kq8").unwrap_or(0);
        for size in [1, 3, 8, 64] {
            let Streamed { released, blocked, findings, .. } = stream_arguments(&rules, json, size);
            assert!(blocked && !released.contains("Kq8"), "{size}: {released:?}");
            assert!(
                findings.iter().any(|f| (f.start, f.end) == (at, at + 12) && f.action == Action::Block),
                "{findings:?}"
            );
        }
    }
    let quiet = stream_arguments(&rules, r#"{"name": "LOG_LEVEL", "value": "Kq8Wz3Tv6Lx2"}"#, 4);
    assert!(!quiet.blocked, "{:?}", quiet.findings);
}

/// A manifest written into a tool call's arguments is read after JSON decoding.
#[test]
fn a_named_value_in_tool_call_arguments_is_read_after_json_decoding() {
    let rules = builtin();
    let json = r#"{"path": "deploy.yaml", "content": "env:\n  - name: DB_PASSWORD\n    value: Kq8Wz3Tv6Lx2\n"}"#;
    let at = json.find("Kq8").unwrap_or(0);
    for size in [1, 3, 8, 64] {
        let Streamed { released, blocked, findings, .. } = stream_arguments(&rules, json, size);
        assert!(blocked && !released.contains("Kq8"), "{size}: {released:?}");
        assert!(
            findings.iter().any(|f| (f.start, f.end) == (at, at + 12) && f.action == Action::Block),
            "{findings:?}"
        );
    }
}

/// HTML tables: a row a line, a cell a line, and one on one line.
const HTML_TABLES: [&str; 3] = [
    "<table>\n  <tr><th>User</th><th>Password</th></tr>\n  <tr><td>alice</td><td><code>Kq8Wz3Tv6Lx2</code></td></tr>\n</table>\n",
    "<table class=\"accounts\">\n<thead>\n<tr>\n  <th>Service</th>\n  <th>API key</th>\n</tr>\n</thead>\n<tbody>\n<tr>\n  <td>billing</td>\n  <td>Kq8Wz3Tv6Lx2</td>\n</tr>\n</tbody>\n</table>\n",
    "Accounts: <table><tr><th>User</th><th>Token</th></tr><tr><td>ci</td><td>Kq8Wz3Tv6Lx2</td></tr></table> (rotate them)",
];

/// An HTML table's credential cells are candidates: acme's password in one blocks in
/// globex's answer, before any byte of it goes out, and goes back to acme; an unknown
/// value passes.
#[test]
fn another_tenants_secret_in_an_html_table_blocks_before_it_goes_out() {
    let rules = builtin();
    let det = secrets_owned_by(&rules, "acme", "DB_PASSWORD = \"Kq8Wz3Tv6Lx2\"");
    let (acme, globex) = (ScanContext::new("acme"), ScanContext::new("globex"));
    for text in HTML_TABLES {
        let at = text.find("Kq8").unwrap_or(0);
        let blocks = |ctx: &ScanContext| {
            rules.scan_with(text, ctx, &det).iter().any(|f| f.start == at && f.action == Action::Block)
        };
        assert!(blocks(&globex), "{text}");
        assert!(!blocks(&acme), "{text}");
        assert!(rules.scan(text).is_empty(), "an unknown value passes: {:?}", rules.scan(text));
        check_blocks_in_every_chunking(&rules, &globex, &det, text, &[1, 3, 7, 16], "Kq");
    }
}

/// A name waits for its value only while lines stay at its column: a line that starts left of
/// it closes the record. A stream stops holding such a line as soon as its indentation shows,
/// so a block later on that line releases what one-shot scanning cuts at, not less.
#[test]
fn a_name_stops_waiting_at_an_outdented_line() {
    let rules = builtin();
    let (ctx, det) = (ScanContext::anonymous(), Arc::new(Detectors::default()));
    let text = "valueFrom:\n  secretKeyRef:\n    name: app-secrets\n    key: password\n  \"githubToken\": \"ghu_JcMfsVALFKFPIpdC9wTzKZHpSB2SN723NGT1\",\n  \"version\": 3\n";
    assert!(rules.scan(text).iter().any(|f| f.action == Action::Block), "{:?}", rules.scan(text));
    check_chunking(&rules, &ctx, &det, text, &char_cuts(text));
    let token_end = text.find("NGT1\"").map_or(0, |at| at + 5);
    check_chunking(&rules, &ctx, &det, text, &[token_end]);
}
