//! `crossguard scan`: one-shot scanning of files or of a JSONL corpus with the secret rules
//! and canaries (no tenant: every canary counts as foreign).
//!
//! Output contract, one JSON object per line and per finding:
//! `{"id":…,"rule_id":"…","start":N,"end":N,"severity":"…","action":"…"}` where `start..end`
//! is the secret's byte span in the text; `id` is the file path for files (`-` for stdin)
//! and the record's `id`, verbatim, for `--input-jsonl` records `{"id":…,"text":"…"}`. With
//! `--read-encoded`, a finding in the decoded text of encoded text adds `"encoding"`
//! (`base64`, `hex`, `percent`, `char_codes`, `spelled`), its span covering the encoded
//! characters.
//! Exit status: 0 no findings, 1 findings, 2 an error (bad rules, unreadable input, a bad
//! record — the other records are still scanned).

use std::borrow::Cow;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use firewall::{DecodeConfig, Detectors, Finding, LoadOptions, RuleFiles, Ruleset, ScanContext};
use serde_json::value::RawValue;

pub struct ScanArgs {
    /// Rules folder; `None` = the built-in ruleset.
    pub rules: Option<PathBuf>,
    /// Text files; `-` is stdin.
    pub files: Vec<PathBuf>,
    /// A JSONL corpus of `{"id":…,"text":"…"}` records; `-` is stdin.
    pub input_jsonl: Option<PathBuf>,
    /// Whether encoded runs are decoded and scanned too.
    pub read_encoded: bool,
}

/// A JSONL record, borrowed from its line: the `id` as written, the text itself wherever
/// it has no escapes to undo.
#[derive(serde::Deserialize)]
struct Record<'a> {
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(borrow)]
    text: Cow<'a, str>,
}

/// Counts what happened, for the exit status.
#[derive(Default)]
struct Outcome {
    findings: usize,
    errors: usize,
}

pub fn scan(args: &ScanArgs) -> ExitCode {
    // One-shot scanning never streams: the streaming automata (most of the loading time)
    // are not built. A rules folder still has its samples checked; the built-in rules had
    // theirs checked by the test suite on the very files embedded in this binary, so
    // checking them again would only add start-up time, and each of their regexes is
    // compiled only if a text's keywords call for its rule.
    let files = RuleFiles::folder_or_builtin(args.rules.as_deref());
    let builtin = files == RuleFiles::Builtin;
    let opts = LoadOptions { check_samples: !builtin, defer_streaming: true, defer_regexes: builtin };
    let rules = match Ruleset::load(&files, &[], opts) {
        Ok(r) => r,
        Err(e) => {
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut outcome = Outcome::default();
    let scanner = Scanner {
        rules: &rules,
        detectors: Detectors { decode: args.read_encoded.then(DecodeConfig::default), ..Detectors::default() },
    };
    if let Some(path) = &args.input_jsonl {
        scan_jsonl(&scanner, path, &mut out, &mut outcome);
    }
    let mut batch = FileBatch::default();
    for path in &args.files {
        match read_text(path) {
            Ok(text) => {
                batch.push(&path.display().to_string(), text);
                if batch.is_full() {
                    batch.emit(&scanner, &mut out, &mut outcome);
                }
            }
            Err(e) => {
                // Findings of the files before it come out before its error.
                batch.emit(&scanner, &mut out, &mut outcome);
                eprintln!("{}: {e}", path.display());
                outcome.errors += 1;
            }
        }
    }
    batch.emit(&scanner, &mut out, &mut outcome);
    if let Err(e) = out.flush() {
        eprintln!("writing findings: {e}");
        outcome.errors += 1;
    }
    // The process ends here: freeing the compiled rules one allocation at a time would
    // cost 5 % of what loading them did, for memory the OS takes back anyway.
    std::mem::forget(rules);
    match outcome {
        Outcome { errors: 1.., .. } => ExitCode::from(2),
        Outcome { findings: 1.., .. } => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    }
}

fn open(path: &Path) -> std::io::Result<Box<dyn Read>> {
    if path.as_os_str() == "-" {
        Ok(Box::new(std::io::stdin().lock()))
    } else {
        Ok(Box::new(std::fs::File::open(path)?))
    }
}

fn read_text(path: &Path) -> Result<String, String> {
    let mut bytes = Vec::new();
    open(path).and_then(|mut r| r.read_to_end(&mut bytes)).map_err(|e| format!("cannot read: {e}"))?;
    String::from_utf8(bytes).map_err(|e| format!("not UTF-8 text (first bad byte at {})", e.utf8_error().valid_up_to()))
}

/// The rules and what else a scan reads.
struct Scanner<'a> {
    rules: &'a Ruleset,
    detectors: Detectors,
}

fn scan_jsonl(scanner: &Scanner<'_>, path: &Path, out: &mut impl Write, outcome: &mut Outcome) {
    let mut reader = match open(path) {
        Ok(r) => BufReader::with_capacity(1 << 20, r),
        Err(e) => {
            eprintln!("{}: cannot read: {e}", path.display());
            outcome.errors += 1;
            return;
        }
    };
    let mut batch = JsonlBatch { path, bytes: Vec::new(), lines: Vec::new() };
    for n in 1.. {
        // A record is never held back waiting for input: what the input has ready is
        // scanned and written out before reading on (a pipe fed one record at a time gets
        // each answer as it goes).
        if reader.buffer().is_empty() && !batch.lines.is_empty() {
            batch.emit(scanner, out, outcome);
            if let Err(e) = out.flush() {
                eprintln!("writing findings: {e}");
                outcome.errors += 1;
                return;
            }
        }
        // Lines are read as bytes, so a line that is not UTF-8 is one bad record like any
        // other and the records after it are still scanned (serde_json checks the UTF-8 of
        // what it decodes).
        let start = batch.bytes.len();
        match reader.read_until(b'\n', &mut batch.bytes) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                batch.bytes.truncate(start);
                batch.emit(scanner, out, outcome);
                eprintln!("{}:{n}: cannot read: {e}", path.display());
                outcome.errors += 1;
                return;
            }
        }
        if batch.bytes[start..].trim_ascii().is_empty() {
            batch.bytes.truncate(start);
            continue;
        }
        batch.lines.push((n, start..batch.bytes.len()));
        if batch.is_full() {
            batch.emit(scanner, out, outcome);
        }
    }
    batch.emit(scanner, out, outcome);
}

/// Records are scanned together (`Ruleset::scan_batch_with`, rule by rule over the records)
/// once there are this many of them or [`BATCH_BYTES`] of text, or the input has nothing
/// more ready. Each batch brings every rule's lazy DFA back into the caches once; on an
/// AVX2-only host, batches of 2,048 LLM-style records (about 4 MB) scanned the secret-dense
/// corpus in 12-16 % less CPU time than batches of 256, and 8,192 (16 MB of text, past what
/// the caches keep) gave part of that back (BENCHMARKS.md, "Scan speed per host kind"). A
/// pipe still gets each answer as soon as its input pauses (see `scan_jsonl`).
const BATCH_RECORDS: usize = 2048;
const BATCH_BYTES: usize = 16 << 20;

/// The lines of a JSONL input read but not scanned yet, one after another as read. Each is
/// parsed when its batch is scanned: its text is read in place where it has no escapes,
/// and its `id` is written out as the record wrote it.
struct JsonlBatch<'p> {
    path: &'p Path,
    bytes: Vec<u8>,
    /// Each line's number in the input and its place in `bytes`.
    lines: Vec<(usize, Range<usize>)>,
}

impl JsonlBatch<'_> {
    fn is_full(&self) -> bool {
        self.lines.len() >= BATCH_RECORDS || self.bytes.len() >= BATCH_BYTES
    }

    /// Scans the records held and writes their findings, record after record; a line that
    /// is not a record is reported after the findings of the records before it.
    fn emit(&mut self, scanner: &Scanner<'_>, out: &mut impl Write, outcome: &mut Outcome) {
        let mut ids = Vec::with_capacity(self.lines.len());
        let mut texts = Vec::with_capacity(self.lines.len());
        for (n, range) in &self.lines {
            let line = self.bytes.get(range.clone()).unwrap_or_default();
            match serde_json::from_slice::<Record<'_>>(line) {
                Ok(rec) => {
                    ids.push(rec.id);
                    texts.push(rec.text);
                }
                Err(e) => {
                    scan_and_write(scanner, &ids, &texts, out, outcome);
                    ids.clear();
                    texts.clear();
                    let path = self.path.display();
                    match std::str::from_utf8(line) {
                        Err(bad) => {
                            eprintln!("{path}:{n}: not UTF-8 (first bad byte at column {})", bad.valid_up_to() + 1)
                        }
                        Ok(_) => eprintln!("{path}:{n}: not a {{\"id\",\"text\"}} record: {e}"),
                    }
                    outcome.errors += 1;
                }
            }
        }
        scan_and_write(scanner, &ids, &texts, out, outcome);
        self.bytes.clear();
        self.lines.clear();
    }
}

/// Files read but not scanned yet (see [`BATCH_RECORDS`]), each known by its path.
#[derive(Default)]
struct FileBatch {
    ids: Vec<Box<RawValue>>,
    texts: Vec<String>,
    bytes: usize,
}

impl FileBatch {
    fn push(&mut self, path: &str, text: String) {
        let Ok(id) = serde_json::value::to_raw_value(path) else { return };
        self.bytes += text.len();
        self.ids.push(id);
        self.texts.push(text);
    }

    fn is_full(&self) -> bool {
        self.ids.len() >= BATCH_RECORDS || self.bytes >= BATCH_BYTES
    }

    fn emit(&mut self, scanner: &Scanner<'_>, out: &mut impl Write, outcome: &mut Outcome) {
        let ids: Vec<&RawValue> = self.ids.iter().map(|id| &**id).collect();
        scan_and_write(scanner, &ids, &self.texts, out, outcome);
        self.ids.clear();
        self.texts.clear();
        self.bytes = 0;
    }
}

/// Scans `texts` together and writes their findings, text after text.
fn scan_and_write(
    scanner: &Scanner<'_>,
    ids: &[&RawValue],
    texts: &[impl AsRef<str>],
    out: &mut impl Write,
    outcome: &mut Outcome,
) {
    if texts.is_empty() {
        return;
    }
    let texts: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
    let found = scanner.rules.scan_batch_with(&texts, &ScanContext::anonymous(), &scanner.detectors);
    for (id, findings) in ids.iter().zip(found) {
        write_findings(id, findings, out, outcome);
    }
}

fn write_findings(id: &RawValue, findings: Vec<Finding>, out: &mut impl Write, outcome: &mut Outcome) {
    for f in findings {
        if let Err(e) = write_line(id, &f, out) {
            eprintln!("writing findings: {e}");
            outcome.errors += 1;
            return;
        }
        outcome.findings += 1;
    }
}

/// One finding's line of the output contract, written field by field: what serializing the
/// contract's `Line` writes (a test holds them equal) at three quarters of the cost.
fn write_line(id: &RawValue, f: &Finding, out: &mut impl Write) -> std::io::Result<()> {
    out.write_all(b"{\"id\":")?;
    out.write_all(id.get().as_bytes())?;
    out.write_all(b",\"rule_id\":")?;
    serde_json::to_writer(&mut *out, &f.rule_id)?;
    let (severity, action) = (f.severity.as_str(), f.action.as_str());
    write!(out, ",\"start\":{},\"end\":{},\"severity\":\"{severity}\",\"action\":\"{action}\"", f.start, f.end)?;
    if let Some(encoding) = f.encoding {
        out.write_all(b",\"encoding\":")?;
        serde_json::to_writer(&mut *out, &encoding)?;
    }
    out.write_all(b"}\n")
}

#[cfg(test)]
mod tests {
    use firewall::{Action, Encoding, Severity};

    use super::*;

    /// The output contract's line, as `write_line` writes it.
    #[derive(serde::Serialize)]
    struct Line<'a> {
        id: &'a RawValue,
        rule_id: &'a str,
        start: usize,
        end: usize,
        severity: Severity,
        action: Action,
        #[serde(skip_serializing_if = "Option::is_none")]
        encoding: Option<Encoding>,
    }

    /// Every severity, action and encoding, ids of every JSON kind: the hand-written line
    /// is the serialized contract line, byte for byte.
    #[test]
    fn a_written_line_is_the_serialized_contract_line() {
        let severities = [Severity::Low, Severity::Medium, Severity::High, Severity::Critical];
        let actions = [Action::Allow, Action::Log, Action::Redact, Action::Block];
        let encodings = [
            None,
            Some(Encoding::Base64),
            Some(Encoding::Percent),
            Some(Encoding::CharCodes),
            Some(Encoding::JettyObf),
        ];
        let ids = [r#""a\"b\u00e9/c""#, "7", "-1.5e3", "[1, {\"k\": null}]", "true", "null"];
        for (n, id) in ids.iter().enumerate() {
            let id: &RawValue = serde_json::from_str(id).expect("raw id");
            for &severity in &severities {
                for &action in &actions {
                    for &encoding in &encodings {
                        let f = Finding {
                            rule_id: format!("rule-{n}"),
                            start: n,
                            end: 40 + n,
                            match_start: 0,
                            match_end: 50,
                            severity,
                            action,
                            excerpt: String::new(),
                            kind: firewall::DetectorKind::Secret,
                            detail: firewall::Detail::None,
                            encoding,
                        };
                        let line =
                            Line { id, rule_id: &f.rule_id, start: f.start, end: f.end, severity, action, encoding };
                        let mut want = serde_json::to_vec(&line).expect("serializes");
                        want.push(b'\n');
                        let mut written = Vec::new();
                        write_line(id, &f, &mut written).expect("writes");
                        assert_eq!(String::from_utf8_lossy(&written), String::from_utf8_lossy(&want));
                    }
                }
            }
        }
    }
}
