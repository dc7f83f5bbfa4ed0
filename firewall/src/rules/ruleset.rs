//! Loading a ruleset: rule files in, one validated [`Ruleset`] or every error out.
//!
//! Invariants: a [`Ruleset`] exists only if every file parsed, every rule and canary
//! validated, ids are unique across all files, the streaming automata built (unless
//! [`LoadOptions::defer_streaming`] puts that off to first use) and (unless
//! [`LoadOptions::check_samples`] is off) every sample behaved. There is no partial result:
//! one bad file means `Err` with all errors, each naming file:line, the rule id and why.
//! File reading happens only in [`Ruleset::dir_sources`] (which [`Ruleset::load_dir`] and the
//! gateway call); everything else works on strings, so
//! the built-in set (embedded by `build.rs`) goes through the very same checks.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::rules::rule::{AllowCache, Canary, FieldError, RawCanary, RawRule, Rule};
use crate::scan::{Engine, LiveBuild};

/// One problem in the rule files.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadError {
    pub file: String,
    /// 1-based; 0 when the problem concerns the file or folder as a whole.
    pub line: usize,
    pub rule_id: Option<String>,
    pub reason: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Line 0: the error is about the whole file, or about canaries given as values.
        match self.line {
            0 => write!(f, "{}: ", self.file)?,
            line => write!(f, "{}:{line}: ", self.file)?,
        }
        if let Some(id) = &self.rule_id {
            write!(f, "rule `{id}`: ")?;
        }
        f.write_str(&self.reason)
    }
}

/// Every problem found while loading; never empty.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct LoadErrors {
    pub errors: Vec<LoadError>,
}

impl fmt::Display for LoadErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} error(s) in the rule files:", self.errors.len())?;
        for e in &self.errors {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

/// How strict loading is.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Reject rules whose `must_match` / `must_not_match` samples fail. `rules test` turns
    /// this off to report per rule instead.
    pub check_samples: bool,
    /// Build the streaming automata when the first [`crate::StreamScanner`] needs them, not
    /// now. Determinising them is most of the loading time and one-shot scanning
    /// ([`Ruleset::scan`]) never uses them. The price: their size limits are not checked at
    /// load, and a pattern whose automaton turns out too large is streamed as "possibly in
    /// progress anywhere" (still sound, but held back up to the holdback limit). For
    /// one-shot tools such as `crossguard scan`; anything that streams should load eagerly.
    pub defer_streaming: bool,
    /// Parse and compile each rule's regex, and compile each `allow` list, when a scan
    /// first needs it, not now: a scan runs only the rules its text's keywords hit, and
    /// parsing and compiling the others was most of loading the built-in rules. A pattern
    /// that does not parse, names a secret group it lacks or does not compile (past the size
    /// limit) is then not refused: its rule finds nothing (an `allow` pattern, exempts
    /// nothing). So only for rules known to load, such as the built-in ones (the test suite
    /// loads them in full), and not with `check_samples`, whose samples run every rule anyway.
    pub defer_regexes: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { check_samples: true, defer_streaming: false, defer_regexes: false }
    }
}

/// Where a rule was written, for messages and sample reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Origin {
    pub file: String,
    pub line: usize,
    /// Line of each `must_match` sample, then of each `must_not_match` sample.
    pub must_match_lines: Vec<usize>,
    pub must_not_match_lines: Vec<usize>,
}

/// Where rule files come from: the set built into the binary, or a folder of `*.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleFiles {
    Builtin,
    Folder(PathBuf),
}

impl RuleFiles {
    /// The folder when one is configured, else the built-in files: the one place this
    /// choice is made (the server, `rules check|test` and `scan` all ask here).
    pub fn folder_or_builtin(dir: Option<&Path>) -> RuleFiles {
        dir.map_or(RuleFiles::Builtin, |d| RuleFiles::Folder(d.to_path_buf()))
    }

    /// Their files' texts, as [`Ruleset::load_sources`] takes them.
    pub fn sources(&self) -> Result<Vec<RuleSource>, LoadErrors> {
        match self {
            RuleFiles::Builtin => Ok(Ruleset::builtin_sources()),
            RuleFiles::Folder(dir) => Ruleset::dir_sources(dir),
        }
    }
}

impl fmt::Display for RuleFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleFiles::Builtin => f.write_str("built-in rules"),
            RuleFiles::Folder(dir) => write!(f, "{}", dir.display()),
        }
    }
}

/// One rule file's text, and the name its errors and origins cite (a path, or a label for
/// built-in and in-memory files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSource {
    pub file: String,
    pub text: String,
}

impl RuleSource {
    pub fn new(file: impl Into<String>, text: impl Into<String>) -> RuleSource {
        RuleSource { file: file.into(), text: text.into() }
    }
}

/// What errors and origins of canaries given as values name as their file (see
/// [`Ruleset::load_sources_with_canaries`]).
pub const INJECTED_CANARIES: &str = "(injected canaries)";

/// A compiled, validated set of rules and canaries. Immutable; share it through `Arc`.
#[derive(Debug)]
pub struct Ruleset {
    pub(crate) rules: Vec<Rule>,
    pub(crate) origins: Vec<Origin>,
    pub(crate) canaries: Vec<Canary>,
    pub(crate) engine: Engine,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    /// Named lists of patterns that rules of any file in the folder take by
    /// `allow_lists = [NAME, ...]` into `allow` (the placeholder shapes most generic rules
    /// share), by `allow_line_lists` into `allow_line` and by `allow_decoded_lists` into
    /// `allow_decoded`.
    #[serde(default)]
    allow_lists: Option<toml::Spanned<toml::Table>>,
    #[serde(default)]
    rule: Vec<toml::Spanned<toml::Table>>,
    #[serde(default)]
    canary: Vec<toml::Spanned<toml::Table>>,
}

/// The folder's `[allow_lists]`, by name; `None` for a list defined with errors (reported at
/// its own line), so that the rules naming it say so instead of calling it undefined.
type AllowLists = std::collections::HashMap<String, Option<Vec<String>>>;

mod builtin {
    include!(concat!(env!("OUT_DIR"), "/builtin_rules.rs"));
}

/// What one file contributed before the cross-file checks.
#[derive(Default)]
struct Parsed {
    rules: Vec<(Rule, Origin)>,
    canaries: Vec<(Canary, Origin)>,
    errors: Vec<LoadError>,
}

impl Ruleset {
    /// Loads `files` plus `canaries` given as values (see
    /// [`Ruleset::load_sources_with_canaries`]).
    pub fn load(files: &RuleFiles, canaries: &[RawCanary], opts: LoadOptions) -> Result<Ruleset, LoadErrors> {
        Self::load_sources_with_canaries(&files.sources()?, canaries, opts)
    }

    /// Loads every `*.toml` directly inside `dir` (sorted by name), with samples checked.
    pub fn load_dir(dir: &Path) -> Result<Ruleset, LoadErrors> {
        Self::load(&RuleFiles::Folder(dir.to_path_buf()), &[], LoadOptions::default())
    }

    /// Every `*.toml` directly inside `dir`, sorted by name: what [`Ruleset::load_dir`]
    /// loads, for callers that add sources of their own.
    pub fn dir_sources(dir: &Path) -> Result<Vec<RuleSource>, LoadErrors> {
        let whole = |reason: String| LoadErrors {
            errors: vec![LoadError { file: dir.display().to_string(), line: 0, rule_id: None, reason }],
        };
        let entries = std::fs::read_dir(dir).map_err(|e| whole(format!("cannot read the rules folder: {e}")))?;
        let mut paths: Vec<_> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(whole("no *.toml rule files in this folder".into()));
        }
        let mut sources = Vec::new();
        let mut errors = Vec::new();
        for p in paths {
            match std::fs::read_to_string(&p) {
                Ok(text) => sources.push(RuleSource::new(p.display().to_string(), text)),
                Err(e) => errors.push(LoadError {
                    file: p.display().to_string(),
                    line: 0,
                    rule_id: None,
                    reason: format!("cannot read: {e}"),
                }),
            }
        }
        if !errors.is_empty() {
            return Err(LoadErrors { errors });
        }
        Ok(sources)
    }

    /// The default ruleset shipped in the binary (the repository's `rules/*.toml`).
    pub fn builtin() -> Result<Ruleset, LoadErrors> {
        Self::load(&RuleFiles::Builtin, &[], LoadOptions::default())
    }

    /// The rule files built into the binary.
    pub fn builtin_sources() -> Vec<RuleSource> {
        builtin::FILES.iter().map(|(name, text)| RuleSource::new(format!("rules/{name}"), *text)).collect()
    }

    /// Loads rule files' texts; their names only label messages.
    pub fn load_sources(sources: &[RuleSource], opts: LoadOptions) -> Result<Ruleset, LoadErrors> {
        Self::load_sources_with_canaries(sources, &[], opts)
    }

    /// As [`Ruleset::load_sources`], plus canaries given as values (a server's canaries made
    /// at run time, not written in a rule file). They are checked like a file's `[[canary]]`
    /// tables and share the ids' namespace; their errors name [`INJECTED_CANARIES`] as file.
    pub fn load_sources_with_canaries(
        sources: &[RuleSource],
        canaries: &[RawCanary],
        opts: LoadOptions,
    ) -> Result<Ruleset, LoadErrors> {
        let mut all = Parsed::default();
        let mut allow = AllowCache::default();
        // Lists first: a rule may name a list that a later file defines.
        let mut read = Vec::new();
        for RuleSource { file, text } in sources {
            match read_file(file, text) {
                Ok(raw) => read.push((file.as_str(), text.as_str(), raw)),
                Err(e) => all.errors.push(e),
            }
        }
        let lists = collect_allow_lists(&mut read, opts.defer_regexes, &mut all.errors);
        for (file, text, raw) in read {
            let p = parse_file(file, text, raw, &lists, &mut allow, opts.defer_regexes);
            all.rules.extend(p.rules);
            all.canaries.extend(p.canaries);
            all.errors.extend(p.errors);
        }
        for raw in canaries {
            let origin = Origin { file: INJECTED_CANARIES.into(), line: 0, ..Origin::default() };
            match raw.clone().compile() {
                Ok(c) => all.canaries.push((c, origin)),
                Err(errs) => all.errors.extend(errs.into_iter().map(|FieldError { key, reason }| LoadError {
                    file: INJECTED_CANARIES.into(),
                    line: 0,
                    rule_id: Some(raw.id.clone()),
                    reason: format!("{key}: {reason}"),
                })),
            }
        }
        let duplicates = duplicate_ids(&all);
        all.errors.extend(duplicates);
        if !all.errors.is_empty() {
            return Err(LoadErrors { errors: all.errors });
        }
        let (rules, origins): (Vec<_>, Vec<_>) = all.rules.into_iter().unzip();
        let (canaries, canary_origins): (Vec<_>, Vec<_>) = all.canaries.into_iter().unzip();
        let when = if opts.defer_streaming { LiveBuild::OnFirstUse } else { LiveBuild::Now };
        let engine = Engine::build(&rules, &canaries, when).map_err(|errs| LoadErrors {
            errors: errs
                .into_iter()
                .map(|(i, reason)| {
                    let (o, id) = match i {
                        Some(i) => (origins.get(i), rules.get(i).map(|r| r.id.clone())),
                        None => (canary_origins.first(), None),
                    };
                    let (file, line) = o.map_or((String::new(), 0), |o| (o.file.clone(), o.line));
                    LoadError { file, line, rule_id: id, reason }
                })
                .collect(),
        })?;
        let set = Ruleset { rules, origins, canaries, engine };
        if opts.check_samples {
            let errors = set.run_samples().into_errors();
            if !errors.is_empty() {
                return Err(LoadErrors { errors });
            }
        }
        Ok(set)
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn origins(&self) -> &[Origin] {
        &self.origins
    }

    pub fn canaries(&self) -> &[Canary] {
        &self.canaries
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Bytes held by the compiled automata (keyword prefilter, and the streaming DFAs once
    /// built; see [`LoadOptions::defer_streaming`]).
    pub fn memory_usage(&self) -> usize {
        self.engine.memory_usage()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.canaries.is_empty()
    }

    /// An empty ruleset (no rules, no canaries): scanning finds nothing.
    pub fn empty() -> Ruleset {
        let engine = Engine::build(&[], &[], LiveBuild::Now).unwrap_or_else(|_| Engine::default());
        Ruleset { rules: Vec::new(), origins: Vec::new(), canaries: Vec::new(), engine }
    }
}

/// Rule and canary ids share one namespace: a finding's `rule_id` names exactly one table.
fn duplicate_ids(all: &Parsed) -> Vec<LoadError> {
    let mut errors = Vec::new();
    let mut seen: HashMap<&str, &Origin> = HashMap::new();
    let ids =
        all.rules.iter().map(|(r, o)| (r.id.as_str(), o)).chain(all.canaries.iter().map(|(c, o)| (c.id.as_str(), o)));
    for (id, o) in ids {
        if let Some(first) = seen.get(id) {
            errors.push(LoadError {
                file: o.file.clone(),
                line: o.line,
                rule_id: Some(id.to_string()),
                reason: format!("duplicate id, first defined at {}:{}", first.file, first.line),
            });
        } else {
            seen.insert(id, o);
        }
    }
    errors
}

/// A file's text with the offset of every line start, so that each of the thousand-odd
/// lines a load reports (rules, samples) is a binary search, not a count from the top.
struct Lines<'t> {
    text: &'t str,
    starts: Vec<usize>,
}

impl<'t> Lines<'t> {
    fn new(text: &'t str) -> Lines<'t> {
        let starts = std::iter::once(0)
            .chain(text.bytes().enumerate().filter(|&(_, b)| b == b'\n').map(|(i, _)| i + 1))
            .collect();
        Lines { text, starts }
    }

    /// The 1-based line holding byte `offset`.
    fn of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset.min(self.text.len()))
    }

    /// The line of `key = ...` inside the table spanning `span`, or the table's first line.
    fn key(&self, span: &std::ops::Range<usize>, key: &str) -> usize {
        let body = self.text.get(span.clone()).unwrap_or("");
        let mut off = span.start;
        for l in body.split_inclusive('\n') {
            if let Some(rest) = l.trim_start().strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    return self.of(off);
                }
            }
            off += l.len();
        }
        self.of(span.start)
    }

    /// Line of each sample string inside the table, found by its literal text.
    fn samples(&self, span: &std::ops::Range<usize>, key: &str, samples: &[String]) -> Vec<usize> {
        let body = self.text.get(span.clone()).unwrap_or("");
        let fallback = self.key(span, key);
        samples
            .iter()
            .map(|s| body.find(s.as_str()).filter(|_| !s.is_empty()).map_or(fallback, |i| self.of(span.start + i)))
            .collect()
    }

    /// The line of the key a deserialisation error names (serde quotes it in backticks:
    /// `unknown field `foo``, `missing field `id``) when it is in the table, else the
    /// table's first line.
    fn field_error(&self, span: &std::ops::Range<usize>, table: &toml::Table, message: &str) -> usize {
        let named = message.split('`').nth(1).unwrap_or("");
        match table.keys().find(|k| k.as_str() == named) {
            Some(key) => self.key(span, key),
            None => self.of(span.start),
        }
    }
}

/// A rule file's tables, or its TOML syntax error.
fn read_file(file: &str, text: &str) -> Result<RawFile, LoadError> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| Lines::new(text).of(s.start));
        LoadError { file: file.into(), line, rule_id: None, reason: syntax_reason(text, &e) }
    })
}

/// The patterns of the lists `names` names, in order; or what is wrong with the names: those
/// no list defines and those whose list has errors.
fn resolve_lists(lists: &AllowLists, names: Vec<String>) -> Result<Vec<String>, String> {
    let mut patterns = Vec::new();
    let (mut unknown, mut broken) = (Vec::new(), Vec::new());
    for name in names {
        match lists.get(&name) {
            Some(Some(list)) => patterns.extend(list.iter().cloned()),
            Some(None) => broken.push(name),
            None => unknown.push(name),
        }
    }
    let mut reasons = Vec::new();
    if !unknown.is_empty() {
        reasons.push(format!("{}, which no [allow_lists] table of the folder defines", unknown.join(", ")));
    }
    if !broken.is_empty() {
        reasons.push(format!("{}, whose list has errors", broken.join(", ")));
    }
    match reasons.is_empty() {
        true => Ok(patterns),
        false => Err(reasons.join("; ")),
    }
}

/// Every file's `[allow_lists]`, checked: each a list of patterns that compile, each name
/// defined once in the folder. A list that fails is kept as `None`, so the rules naming it
/// fail too, each at its own `allow_lists` line. With `defer_regexes` (the binary's own
/// rules, which its tests load in full) a pattern is only parsed: compiling the 110 of them
/// was a sixth of every start, for lists compiled again, as alternations, where a scan uses
/// them.
fn collect_allow_lists(
    read: &mut [(&str, &str, RawFile)],
    defer_regexes: bool,
    errors: &mut Vec<LoadError>,
) -> AllowLists {
    let mut lists = AllowLists::new();
    let mut defined_in: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (file, text, raw) in read.iter_mut() {
        let Some(table) = raw.allow_lists.take() else { continue };
        let lines = Lines::new(text);
        let span = table.span();
        for (name, value) in table.into_inner() {
            let err = |reason: String| LoadError {
                file: file.to_string(),
                line: lines.key(&span, &name),
                rule_id: None,
                reason,
            };
            let patterns: Option<Vec<String>> =
                value.as_array().and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect());
            if let Some(first) = defined_in.get(&name) {
                errors.push(err(format!("allow list `{name}` is defined twice (first in {first})")));
                continue;
            }
            defined_in.insert(name.clone(), file.to_string());
            let Some(patterns) = patterns else {
                errors.push(err(format!("allow list `{name}` is not a list of strings")));
                lists.insert(name, None);
                continue;
            };
            let check = |p: &String| match defer_regexes {
                true => regex_syntax::parse(p).err().map(|e| e.to_string()),
                false => regex::Regex::new(p).err().map(|e| e.to_string()),
            };
            let bad: Vec<String> = patterns.iter().filter_map(|p| check(p).map(|e| format!("{p:?}: {e}"))).collect();
            if bad.is_empty() {
                lists.insert(name, Some(patterns));
            } else {
                errors.push(err(format!("allow list `{name}` has a bad pattern: {}", bad.join("; "))));
                lists.insert(name, None);
            }
        }
    }
    lists
}

fn parse_file(
    file: &str,
    text: &str,
    raw: RawFile,
    lists: &AllowLists,
    allow: &mut AllowCache,
    defer_regexes: bool,
) -> Parsed {
    let mut out = Parsed::default();
    let lines = Lines::new(text);
    for table in raw.rule {
        let span = table.span();
        let t = table.into_inner();
        let id = t.get("id").and_then(|v| v.as_str()).map(str::to_string);
        let err = |line: usize, reason: String| LoadError { file: file.into(), line, rule_id: id.clone(), reason };
        let mut parsed: RawRule = match toml::Value::Table(t.clone()).try_into() {
            Ok(r) => r,
            Err(e) => {
                out.errors.push(err(lines.field_error(&span, &t, e.message()), e.message().trim().to_string()));
                continue;
            }
        };
        // The named lists' patterns join the rule's own `allow`, `allow_line` and
        // `allow_decoded`, ahead of them.
        let mut resolved = [
            ("allow_lists", resolve_lists(lists, std::mem::take(&mut parsed.allow_lists))),
            ("allow_line_lists", resolve_lists(lists, std::mem::take(&mut parsed.allow_line_lists))),
            ("allow_decoded_lists", resolve_lists(lists, std::mem::take(&mut parsed.allow_decoded_lists))),
        ];
        for (key, result) in &resolved {
            if let Err(reason) = result {
                out.errors.push(err(lines.key(&span, key), format!("{key} names {reason}")));
            }
        }
        let [(_, Ok(shared)), (_, Ok(shared_line)), (_, Ok(shared_decoded))] = &mut resolved else { continue };
        shared.append(&mut parsed.allow);
        parsed.allow = std::mem::take(shared);
        shared_line.append(&mut parsed.allow_line);
        parsed.allow_line = std::mem::take(shared_line);
        shared_decoded.append(&mut parsed.allow_decoded);
        parsed.allow_decoded = std::mem::take(shared_decoded);
        let origin = Origin {
            file: file.into(),
            line: lines.of(span.start),
            must_match_lines: lines.samples(&span, "must_match", &parsed.must_match),
            must_not_match_lines: lines.samples(&span, "must_not_match", &parsed.must_not_match),
        };
        match parsed.compile_sharing(allow, defer_regexes) {
            Ok(rule) => out.rules.push((rule, origin)),
            Err(errs) => {
                out.errors.extend(errs.into_iter().map(|FieldError { key, reason }| err(lines.key(&span, key), reason)))
            }
        }
    }
    for table in raw.canary {
        let span = table.span();
        let t = table.into_inner();
        let id = t.get("id").and_then(|v| v.as_str()).map(str::to_string);
        let err = |line: usize, reason: String| LoadError { file: file.into(), line, rule_id: id.clone(), reason };
        let origin = Origin {
            file: file.into(),
            line: lines.of(span.start),
            must_match_lines: vec![],
            must_not_match_lines: vec![],
        };
        match toml::Value::Table(t.clone()).try_into::<RawCanary>() {
            Ok(raw) => match raw.compile() {
                Ok(c) => out.canaries.push((c, origin)),
                Err(errs) => out
                    .errors
                    .extend(errs.into_iter().map(|FieldError { key, reason }| err(lines.key(&span, key), reason))),
            },
            Err(e) => out.errors.push(err(lines.field_error(&span, &t, e.message()), e.message().trim().to_string())),
        }
    }
    out
}

/// The reason of a TOML syntax error. toml leaves some without a message (a control
/// character in a comment): those name the character at the error instead, so that no
/// error reads as a bare `file:line:`.
fn syntax_reason(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim();
    if !message.is_empty() {
        return message.to_string();
    }
    match e.span().and_then(|s| text.get(s.start..)).and_then(|rest| rest.chars().next()) {
        Some(c) => format!("invalid TOML: unexpected character {c:?}"),
        None => "invalid TOML".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_counted_from_one_at_every_offset() {
        let lines = Lines::new("ab\ncd\n\nef");
        let got: Vec<usize> = (0..=12).map(|i| lines.of(i)).collect();
        // The newline ends its line; offsets past the end belong to the last line.
        assert_eq!(got, [1, 1, 1, 2, 2, 2, 3, 4, 4, 4, 4, 4, 4]);
    }

    fn load(text: &str) -> Result<Ruleset, LoadErrors> {
        Ruleset::load_sources(&[RuleSource::new("a.toml", text)], LoadOptions::default())
    }

    #[test]
    fn syntax_errors_without_a_toml_message_name_the_character() {
        // Found by the load_rules fuzzer: a NUL in a comment came back as `a.toml:2: `.
        let err = load("# fine\n#\0 not fine\n").unwrap_err();
        let e = &err.errors[0];
        assert_eq!(e.line, 2);
        assert_eq!(e.reason, "invalid TOML: unexpected character '\\0'");
    }

    fn errors(text: &str) -> Vec<String> {
        load(text).err().map(|e| e.errors.iter().map(ToString::to_string).collect()).unwrap_or_default()
    }

    const GOOD: &str = r#"
[[rule]]
id = "demo-token"
description = "demo"
severity = "high"
action = "block"
regex = '''\b(dmo_[a-z0-9]{12})\b'''
secret_group = 1
keywords = ["dmo_"]
must_match = ["x dmo_abcdef123456 y"]
must_not_match = ["dmo_short"]

[[canary]]
id = "acme-canary"
owner = "acme"
strings = ["ACME-CANARY-7f3a9c"]
"#;

    #[test]
    fn loads_rules_and_canaries() {
        let set = load(GOOD).map_err(|e| e.to_string());
        assert!(matches!(&set, Ok(s) if s.len() == 1 && s.canaries().len() == 1), "{set:?}");
        assert!(matches!(&set, Ok(s) if s.origins()[0].line == 2 && s.origins()[0].must_match_lines == [10]));
    }

    #[test]
    fn unknown_key_names_its_line() {
        let e = errors(&GOOD.replace("keywords =", "colour = 1\nkeywords ="));
        assert_eq!(e, ["a.toml:9: rule `demo-token`: unknown field `colour`, expected one of `id`, `description`, `severity`, `action`, `regex`, `secret_group`, `keywords`, `min_entropy`, `judge`, `allow_lists`, `allow`, `allow_line_lists`, `allow_line`, `allow_repeated_user`, `allow_decoded_lists`, `allow_decoded`, `tags`, `must_match`, `must_not_match`"]);
    }

    #[test]
    fn bad_regex_and_unknown_top_level_table() {
        let e = errors(&GOOD.replace(r"\b(dmo_", r"\b((dmo_"));
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("a.toml:7: rule `demo-token`: bad regex:"), "{e:?}");
        let e = errors(&format!("{GOOD}\n[[rules2]]\nid = 'x'\n"));
        assert_eq!(e, ["a.toml:18: unknown field `rules2`, expected one of `allow_lists`, `rule`, `canary`"]);
    }

    #[test]
    fn failing_samples_name_the_sample_line() {
        let e = errors(&GOOD.replace("x dmo_abcdef123456 y", "x dmo_abc y"));
        assert_eq!(e, ["a.toml:10: rule `demo-token`: must_match sample 1 found nothing: \"x dmo_abc y\""]);
        let e = errors(&GOOD.replace("\"dmo_short\"", "\"dmo_zzzzzzzzzzzz\""));
        assert!(e[0].starts_with("a.toml:11: rule `demo-token`: must_not_match sample 1 matched"), "{e:?}");
    }

    #[test]
    fn duplicates_across_files_and_every_error_listed() {
        let two = [RuleSource::new("a.toml", GOOD), RuleSource::new("b.toml", GOOD)];
        let e = Ruleset::load_sources(&two, LoadOptions::default()).err().map(|e| e.errors).unwrap_or_default();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].to_string(), "b.toml:2: rule `demo-token`: duplicate id, first defined at a.toml:2");
        assert_eq!(e[1].to_string(), "b.toml:13: rule `acme-canary`: duplicate id, first defined at a.toml:13");
    }

    fn injected(id: &str, owner: &str, token: &str) -> RawCanary {
        RawCanary { id: id.into(), owner: owner.into(), strings: vec![token.into()], description: None }
    }

    #[test]
    fn canaries_given_as_values_load_and_fire_like_a_files() {
        let sources = [RuleSource::new("a.toml", GOOD)];
        let extra = [injected("injected-canary-1", "globex", "GLOBEX-CANARY-41c9e2")];
        let set = Ruleset::load_sources_with_canaries(&sources, &extra, LoadOptions::default());
        let Ok(set) = set else { panic!("{set:?}") };
        assert_eq!(set.canaries().len(), 2);
        let found = set.scan("leaked: GLOBEX-CANARY-41c9e2 and ACME-CANARY-7f3a9c");
        let mut ids: Vec<&str> = found.iter().map(|f| f.rule_id.as_str()).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["acme-canary", "injected-canary-1"]);
    }

    #[test]
    fn canaries_given_as_values_are_checked_like_a_files() {
        let sources = [RuleSource::new("a.toml", GOOD)];
        let extra = [
            injected("injected-canary-1", "globex", "short"),
            injected("acme-canary", "globex", "GLOBEX-CANARY-41c9e2"),
        ];
        let e = Ruleset::load_sources_with_canaries(&sources, &extra, LoadOptions::default())
            .err()
            .map(|e| e.errors.iter().map(ToString::to_string).collect::<Vec<_>>())
            .unwrap_or_default();
        assert_eq!(
            e,
            [
                "(injected canaries): rule `injected-canary-1`: strings: canary string of 5 chars is shorter than 8",
                "(injected canaries): rule `acme-canary`: duplicate id, first defined at a.toml:13",
            ]
        );
    }

    #[test]
    fn rule_files_are_the_folder_when_given_else_the_builtin_set() {
        assert_eq!(RuleFiles::folder_or_builtin(None), RuleFiles::Builtin);
        let dir = Path::new("/etc/crossguard/rules");
        assert_eq!(RuleFiles::folder_or_builtin(Some(dir)), RuleFiles::Folder(dir.to_path_buf()));
        assert_eq!(RuleFiles::Builtin.to_string(), "built-in rules");
        let builtin = RuleFiles::Builtin.sources().map(|s| s.len());
        assert_eq!(builtin.ok(), Some(Ruleset::builtin_sources().len()));
        let missing = RuleFiles::Folder("/nonexistent/crossguard-rules".into()).sources();
        assert!(missing.is_err_and(|e| e.errors[0].reason.starts_with("cannot read the rules folder")));
    }

    #[test]
    fn syntax_errors_and_missing_fields() {
        let e = errors("[[rule]]\nid = \"x\"\nregex = 'a\n");
        assert!(e[0].starts_with("a.toml:3:"), "{e:?}");
        let e = errors("[[rule]]\nid = \"x-y\"\n");
        assert!(e[0].starts_with("a.toml:1: rule `x-y`: missing field"), "{e:?}");
    }

    #[test]
    fn load_dir_reads_only_toml_and_rejects_empty_folders() {
        let dir = tempfile::tempdir().map_err(|e| e.to_string());
        let Ok(dir) = dir else { return };
        assert!(Ruleset::load_dir(dir.path()).is_err());
        let _ = std::fs::write(dir.path().join("a.toml"), GOOD);
        let _ = std::fs::write(dir.path().join("README.md"), "not rules");
        assert!(matches!(Ruleset::load_dir(dir.path()), Ok(s) if s.len() == 1));
    }

    const NAMES_A_LIST: &str = r#"
[[rule]]
id = "tok"
description = "d"
severity = "high"
action = "block"
regex = 'tok_([a-z0-9]{8})'
secret_group = 1
keywords = ["tok_"]
allow_lists = ["placeholders"]
must_match = ["tok_q8w2e9r4"]
must_not_match = ["tok_examples"]
"#;

    fn load_files(files: &[(&str, &str)]) -> Result<Ruleset, LoadErrors> {
        let sources: Vec<RuleSource> = files.iter().map(|(name, text)| RuleSource::new(*name, *text)).collect();
        Ruleset::load_sources(&sources, LoadOptions::default())
    }

    #[test]
    fn a_rule_takes_the_patterns_of_a_list_that_another_file_defines() {
        let lists = "[allow_lists]\nplaceholders = ['example']\n";
        let set = load_files(&[("a.toml", NAMES_A_LIST), ("b.toml", lists)]);
        let Ok(set) = set else { panic!("{set:?}") };
        assert!(set.scan("tok_examples").is_empty());
        assert_eq!(set.scan("tok_q8w2e9r4").len(), 1);
    }

    /// `rule` (a.toml), loaded without the file that defines its list: one error, at line 10
    /// (the key that names the list), whose reason starts with `reason`.
    fn assert_unknown_list_is_an_error_at_its_line(rule: &str, reason: &str) {
        let errors = load_files(&[("a.toml", rule)]).err().map(|e| e.errors).unwrap_or_default();
        assert_eq!(errors.iter().map(|e| e.line).collect::<Vec<_>>(), [10], "{errors:?}");
        assert!(errors[0].reason.starts_with(reason), "{errors:?}");
    }

    #[test]
    fn a_rule_takes_a_list_into_allow_line_ahead_of_its_own() {
        let rule = NAMES_A_LIST
            .replace("allow_lists = [\"placeholders\"]", "allow_line_lists = [\"quoted\"]\nallow_line = ['^own: ']")
            .replace("must_not_match = [\"tok_examples\"]", "must_not_match = [\"sample: tok_q8w2e9r4\"]");
        let lists = "[allow_lists]\nquoted = ['sample: tok_[a-z0-9]+$']\n";
        let set = load_files(&[("a.toml", &rule), ("b.toml", lists)]);
        let Ok(set) = set else { panic!("{set:?}") };
        assert!(set.scan("sample: tok_q8w2e9r4").is_empty(), "the list reads the line");
        assert!(set.scan("own: tok_q8w2e9r4").is_empty(), "the rule's own patterns still count");
        assert_eq!(set.scan("tok_q8w2e9r4 sample: x").len(), 1, "the line up to the match only");
        assert_unknown_list_is_an_error_at_its_line(&rule, "allow_line_lists names quoted");
    }

    #[test]
    fn a_rule_takes_a_list_into_allow_decoded_and_an_unknown_one_is_an_error_at_its_line() {
        // `tok_` then base64: `ZXhhbXBsZQ` is `example`, `cTh3MmU5cjQ` is `q8w2e9r4`.
        let rule = NAMES_A_LIST
            .replace("regex = 'tok_([a-z0-9]{8})'", "regex = 'tok_([A-Za-z0-9]{10,11})'")
            .replace("allow_lists = [\"placeholders\"]", "allow_decoded_lists = [\"placeholders\"]")
            .replace("must_match = [\"tok_q8w2e9r4\"]", "must_match = [\"tok_cTh3MmU5cjQ\"]")
            .replace("must_not_match = [\"tok_examples\"]", "must_not_match = [\"tok_ZXhhbXBsZQ\"]");
        let lists = "[allow_lists]\nplaceholders = ['example']\n";
        let set = load_files(&[("a.toml", &rule), ("b.toml", lists)]);
        let Ok(set) = set else { panic!("{set:?}") };
        assert!(set.scan("tok_ZXhhbXBsZQ").is_empty(), "the list reads the decoding");
        assert_eq!(set.scan("tok_cTh3MmU5cjQ").len(), 1);
        assert_eq!(set.scan("tok_exampleXYZ").len(), 1, "not the value as written");
        assert_unknown_list_is_an_error_at_its_line(&rule, "allow_decoded_lists names placeholders");
    }

    #[test]
    fn a_list_that_no_file_defines_is_an_error_at_the_rules_allow_lists_line() {
        let errors = load_files(&[("a.toml", NAMES_A_LIST)]).err().map(|e| e.errors).unwrap_or_default();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            (errors[0].file.as_str(), errors[0].line, errors[0].rule_id.as_deref()),
            ("a.toml", 10, Some("tok"))
        );
        assert!(errors[0].reason.contains("placeholders"), "{}", errors[0].reason);
    }

    #[test]
    fn a_list_defined_twice_or_holding_a_bad_pattern_is_an_error_at_its_line() {
        let first = "[allow_lists]\nplaceholders = ['example']\n";
        let second = "[allow_lists]\nbroken = ['(']\nplaceholders = ['x']\n";
        let rule = NAMES_A_LIST.replace("\"placeholders\"", "\"broken\"");
        let errors = load_files(&[("a.toml", first), ("b.toml", second), ("c.toml", &rule)])
            .err()
            .map(|e| e.errors)
            .unwrap_or_default();
        let mut at: Vec<(&str, usize)> = errors.iter().map(|e| (e.file.as_str(), e.line)).collect();
        at.sort();
        assert_eq!(at, [("b.toml", 2), ("b.toml", 3), ("c.toml", 10)], "{errors:?}");
        assert!(errors.iter().any(|e| e.reason.contains("broken, whose list has errors")), "{errors:?}");
        assert!(errors.iter().any(|e| e.reason.contains("defined twice (first in a.toml)")), "{errors:?}");
        assert!(errors.iter().any(|e| e.reason.contains("`broken` has a bad pattern")), "{errors:?}");
    }
}
