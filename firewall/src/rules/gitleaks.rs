//! Import of gitleaks configurations into crossguard rule files.
//!
//! What converts: `id`, `description`, `regex`, `secretGroup`, `entropy`, `keywords`,
//! `tags`, allowlist `regexes` (aimed at the secret or the match: `allow`; at the line:
//! `allow_line`, which sees the line up to the match's end) and `stopwords`, and the global
//! `[allowlist]` entries (appended to every rule). What cannot, and is reported instead:
//! path-only rules (crossguard scans text, not files), `path` conditions, allowlists by path
//! or commit, regexes the Rust regex crate rejects (look-around, backreferences). gitleaks
//! has no severity, action or samples: imported rules get `severity = "high"`, `action =
//! "block"` and no samples, and every converted rule is validated with the same checks the
//! loader applies.

use toml::{Table, Value};

use crate::rules::rule::{is_kebab, RawRule, RuleAction, SecretGroup};
use crate::verdict::Severity;
use crate::Error;

/// Something about one gitleaks rule worth telling the user.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportNote {
    /// `None` for the file as a whole.
    pub rule_id: Option<String>,
    pub message: String,
}

/// The result of an import.
#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    /// Our TOML, ready to drop into a rules folder (after adding samples).
    pub toml: String,
    pub converted: usize,
    /// Rules that were not converted, and why.
    pub skipped: Vec<ImportNote>,
    /// Converted rules that lost something in translation.
    pub notes: Vec<ImportNote>,
}

#[derive(serde::Serialize)]
struct OutFile {
    rule: Vec<RawRule>,
}

/// Converts a gitleaks TOML config.
pub fn import(text: &str) -> Result<Import, Error> {
    let root: Table = toml::from_str(text).map_err(|e| Error::GitleaksSyntax {
        line: e.span().map_or(0, |s| text[..s.start.min(text.len())].matches('\n').count() + 1),
        reason: e.message().trim().to_string(),
    })?;
    let mut out = Import { toml: String::new(), converted: 0, skipped: Vec::new(), notes: Vec::new() };
    let global = root
        .get("allowlist")
        .and_then(Value::as_table)
        .map(|t| allow_entries(t, None, &mut out.notes))
        .unwrap_or_default();
    let mut rules = Vec::new();
    for r in root.get("rules").and_then(Value::as_array).into_iter().flatten() {
        let Some(t) = r.as_table() else { continue };
        match convert(t, &global, &mut out.notes) {
            Ok(raw) => rules.push(raw),
            Err(note) => out.skipped.push(note),
        }
    }
    out.converted = rules.len();
    let header = "# Imported from a gitleaks configuration by `crossguard rules import-gitleaks`.\n\
                  # Review each rule: set severity and action, and add must_match / must_not_match samples.\n\
                  # Keywords must occur inside every match (see rules/README.md).\n\n";
    let body = toml::to_string(&OutFile { rule: rules }).unwrap_or_default();
    out.toml = format!("{header}{body}");
    Ok(out)
}

fn str_of<'a>(t: &'a Table, key: &str) -> Option<&'a str> {
    t.get(key).and_then(Value::as_str)
}

fn strings_of(t: &Table, key: &str) -> Vec<String> {
    t.get(key).and_then(Value::as_array).into_iter().flatten().filter_map(|v| v.as_str().map(str::to_string)).collect()
}

/// Our `allow` and `allow_line` entries from gitleaks allowlist tables.
#[derive(Debug, Clone, Default)]
struct Allow {
    secret: Vec<String>,
    line: Vec<String>,
}

/// The entries of one gitleaks allowlist table; notes what is dropped or changes meaning.
fn allow_entries(t: &Table, id: Option<&str>, notes: &mut Vec<ImportNote>) -> Allow {
    let note =
        |notes: &mut Vec<ImportNote>, m: String| notes.push(ImportNote { rule_id: id.map(str::to_string), message: m });
    let target = str_of(t, "regexTarget").unwrap_or("secret");
    let mut out = Allow::default();
    let regexes = strings_of(t, "regexes");
    if target == "line" {
        if !regexes.is_empty() {
            note(
                notes,
                format!(
                    "{} allowlist regex(es) aimed at the line now test it up to the match's end (allow_line)",
                    regexes.len()
                ),
            );
        }
        out.line.extend(regexes);
    } else {
        if target == "match" && !regexes.is_empty() {
            note(notes, "allowlist regexes aimed at the match now test the secret".into());
        }
        out.secret.extend(regexes);
    }
    out.secret.extend(strings_of(t, "stopwords").iter().map(|w| format!("(?i){}", regex::escape(w))));
    for key in ["paths", "commits"] {
        let n = strings_of(t, key).len();
        if n > 0 {
            note(notes, format!("{n} allowlist {key} dropped: crossguard scans responses, not repositories"));
        }
    }
    if t.contains_key("condition") {
        note(notes, "allowlist `condition` ignored: entries are alternatives".into());
    }
    out
}

fn convert(t: &Table, global: &Allow, notes: &mut Vec<ImportNote>) -> Result<RawRule, ImportNote> {
    let gl_id = str_of(t, "id").unwrap_or("").to_string();
    let skip = |m: String| ImportNote { rule_id: Some(gl_id.clone()), message: m };
    let Some(regex) = str_of(t, "regex") else {
        return Err(skip("no regex (path-only rule): crossguard scans text, not file names".into()));
    };
    let id = kebab(&gl_id);
    if id != gl_id {
        notes.push(ImportNote { rule_id: Some(gl_id.clone()), message: format!("id renamed to `{id}` (kebab-case)") });
    }
    if t.contains_key("path") {
        notes.push(ImportNote { rule_id: Some(id.clone()), message: "`path` condition dropped".into() });
    }
    let mut allow = global.clone();
    let tables = t.get("allowlist").and_then(Value::as_table).into_iter();
    for a in
        tables.chain(t.get("allowlists").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_table))
    {
        let more = allow_entries(a, Some(&id), notes);
        allow.secret.extend(more.secret);
        allow.line.extend(more.line);
    }
    let raw = RawRule {
        id: id.clone(),
        description: str_of(t, "description")
            .map_or_else(|| format!("imported from gitleaks rule {gl_id}"), str::to_string),
        severity: Severity::High,
        action: RuleAction::Block,
        regex: regex.to_string(),
        secret_group: t
            .get("secretGroup")
            .and_then(Value::as_integer)
            .filter(|&g| g > 0)
            .map(|g| SecretGroup::Index(g as usize)),
        keywords: strings_of(t, "keywords").iter().map(|k| k.to_ascii_lowercase()).collect(),
        min_entropy: t.get("entropy").and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64))),
        judge: None,
        allow_lists: Vec::new(),
        allow_line_lists: Vec::new(),
        allow: allow.secret,
        allow_line: allow.line,
        allow_repeated_user: false,
        allow_decoded_lists: Vec::new(),
        allow_decoded: Vec::new(),
        tags: strings_of(t, "tags"),
        must_match: Vec::new(),
        must_not_match: Vec::new(),
    };
    match raw.clone().compile() {
        Ok(rule) => {
            if let Err(e) = crate::stream::liveness::LiveDfa::build(rule.hir()) {
                return Err(skip(e));
            }
            notes.push(ImportNote { rule_id: Some(id), message: "no samples: add must_match / must_not_match".into() });
            Ok(raw)
        }
        Err(errs) => Err(skip(errs.into_iter().map(|e| e.reason).collect::<Vec<_>>().join("; "))),
    }
}

/// gitleaks ids are usually kebab-case already; otherwise lowercase and hyphenate.
fn kebab(id: &str) -> String {
    if is_kebab(id) {
        return id.to_string();
    }
    let mapped: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let joined = mapped.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-");
    if joined.is_empty() {
        "imported-rule".into()
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::ruleset::{LoadOptions, Ruleset};

    const GITLEAKS: &str = r#"
title = "test"
[allowlist]
paths = ['''vendor/''']
stopwords = ["example"]

[[rules]]
id = "github-pat"
description = "GitHub Personal Access Token"
regex = '''ghp_[0-9a-zA-Z]{36}'''
keywords = ["ghp_"]
entropy = 3

[[rules]]
id = "Generic_API_Key"
regex = '''(?i)api_key\s*=\s*['"]([0-9a-z]{32})['"]'''
secretGroup = 1
keywords = ["api_key"]
[rules.allowlist]
regexTarget = "line"
regexes = ['''test''']

[[rules]]
id = "pkcs12-file"
path = '''\.p12$'''

[[rules]]
id = "lookahead"
regex = '''secret(?=[0-9])'''
"#;

    #[test]
    fn converts_what_it_can_and_says_why_not() {
        let imp = import(GITLEAKS).map_err(|e| e.to_string());
        assert!(imp.is_ok(), "{imp:?}");
        let Ok(imp) = imp else { return };
        assert_eq!(imp.converted, 2);
        let skipped: Vec<_> = imp.skipped.iter().map(|n| n.rule_id.as_deref().unwrap_or("")).collect();
        assert_eq!(skipped, ["pkcs12-file", "lookahead"]);
        assert!(imp.skipped[1].message.contains("bad regex"), "{:?}", imp.skipped[1]);
        assert!(imp.notes.iter().any(|n| n.message.contains("renamed to `generic-api-key`")));
        assert!(imp.notes.iter().any(|n| n.message.contains("now test it up to the match's end (allow_line)")));
        assert!(imp.notes.iter().any(|n| n.message.contains("paths dropped")));
        // The output loads with our loader.
        let set =
            Ruleset::load_sources(&[crate::RuleSource::new("imported.toml", imp.toml.clone())], LoadOptions::default());
        assert!(matches!(&set, Ok(s) if s.len() == 2), "{set:?}\n{}", imp.toml);
        let set = set.unwrap_or_else(|_| Ruleset::empty());
        assert_eq!(set.scan("token ghp_0123456789abcdefghijklmnopqrstuvwxyzAB").len(), 1);
        assert_eq!(set.scan("token ghp_exampleabcdefghijklmnopqrstuvwxyz012").len(), 0);
        // The line allowlist came across: `test` on the line before the match exempts it.
        assert_eq!(set.scan("api_key = '0123456789abcdefghijklmnopqrstuv'").len(), 1);
        assert_eq!(set.scan("test: api_key = '0123456789abcdefghijklmnopqrstuv'").len(), 0);
        assert_eq!(set.scan("test\napi_key = '0123456789abcdefghijklmnopqrstuv'").len(), 1);
    }

    #[test]
    fn syntax_errors_name_the_line() {
        assert!(matches!(import("[[rules]]\nid = \n"), Err(Error::GitleaksSyntax { line: 2, .. })));
    }
}
