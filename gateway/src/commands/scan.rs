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

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use firewall::{
    Action, DecodeConfig, Detectors, Encoding, Finding, LoadOptions, RuleFiles, Ruleset, ScanContext, Severity,
};

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

#[derive(serde::Serialize)]
struct Line<'a> {
    id: &'a serde_json::Value,
    rule_id: &'a str,
    start: usize,
    end: usize,
    severity: Severity,
    action: Action,
    #[serde(skip_serializing_if = "Option::is_none")]
    encoding: Option<Encoding>,
}

#[derive(serde::Deserialize)]
struct Record {
    id: serde_json::Value,
    text: String,
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
    let mut batch = Batch::default();
    for path in &args.files {
        match read_text(path) {
            Ok(text) => {
                batch.push(Record { id: serde_json::Value::String(path.display().to_string()), text });
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
    // Lines are read as bytes, so a line that is not UTF-8 is one bad record like any
    // other and the records after it are still scanned (serde_json checks the UTF-8 of
    // what it decodes).
    let mut line = Vec::new();
    let mut batch = Batch::default();
    for n in 1.. {
        // A record is never held back waiting for input: what the input has ready is
        // scanned and written out before reading on (a pipe fed one record at a time gets
        // each answer as it goes).
        if reader.buffer().is_empty() && !batch.ids.is_empty() {
            batch.emit(scanner, out, outcome);
            if let Err(e) = out.flush() {
                eprintln!("writing findings: {e}");
                outcome.errors += 1;
                return;
            }
        }
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                batch.emit(scanner, out, outcome);
                eprintln!("{}:{n}: cannot read: {e}", path.display());
                outcome.errors += 1;
                return;
            }
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        match serde_json::from_slice::<Record>(&line) {
            Ok(rec) => {
                batch.push(rec);
                if batch.is_full() {
                    batch.emit(scanner, out, outcome);
                }
            }
            Err(e) => {
                // Findings of the records before it come out before its error.
                batch.emit(scanner, out, outcome);
                match std::str::from_utf8(&line) {
                    Err(bad) => eprintln!(
                        "{}:{n}: not UTF-8 (first bad byte at column {})",
                        path.display(),
                        bad.valid_up_to() + 1
                    ),
                    Ok(_) => eprintln!("{}:{n}: not a {{\"id\",\"text\"}} record: {e}", path.display()),
                }
                outcome.errors += 1;
            }
        }
    }
    batch.emit(scanner, out, outcome);
}

/// Records (or files) read but not scanned yet: scanned together (`Ruleset::scan_batch_with`, rule by
/// rule over the records) once there are [`Batch::RECORDS`] of them or [`Batch::BYTES`] of
/// text, or the input has nothing more ready.
#[derive(Default)]
struct Batch {
    ids: Vec<serde_json::Value>,
    texts: Vec<String>,
    bytes: usize,
}

impl Batch {
    // Each batch brings every rule's lazy DFA back into the caches once; on an AVX2-only
    // host, batches of 2,048 LLM-style records (about 4 MB) scanned the secret-dense corpus
    // in 12-16 % less CPU time than batches of 256, and 8,192 (16 MB of text, past what the
    // caches keep) gave part of that back (BENCHMARKS.md, "Scan speed per host kind"). A
    // pipe still gets each answer as soon as its input pauses (see `scan_jsonl`).
    const RECORDS: usize = 2048;
    const BYTES: usize = 16 << 20;

    fn push(&mut self, rec: Record) {
        self.bytes += rec.text.len();
        self.ids.push(rec.id);
        self.texts.push(rec.text);
    }

    fn is_full(&self) -> bool {
        self.ids.len() >= Self::RECORDS || self.bytes >= Self::BYTES
    }

    /// Scans the records held and writes their findings, record after record.
    fn emit(&mut self, scanner: &Scanner<'_>, out: &mut impl Write, outcome: &mut Outcome) {
        if self.ids.is_empty() {
            return;
        }
        let texts: Vec<&str> = self.texts.iter().map(String::as_str).collect();
        let found = scanner.rules.scan_batch_with(&texts, &ScanContext::anonymous(), &scanner.detectors);
        for (id, findings) in self.ids.iter().zip(found) {
            write_findings(id, findings, out, outcome);
        }
        self.ids.clear();
        self.texts.clear();
        self.bytes = 0;
    }
}

fn write_findings(id: &serde_json::Value, findings: Vec<Finding>, out: &mut impl Write, outcome: &mut Outcome) {
    for f in findings {
        let line = Line {
            id,
            rule_id: &f.rule_id,
            start: f.start,
            end: f.end,
            severity: f.severity,
            action: f.action,
            encoding: f.encoding,
        };
        let written =
            serde_json::to_writer(&mut *out, &line).map_err(std::io::Error::from).and_then(|()| out.write_all(b"\n"));
        if let Err(e) = written {
            eprintln!("writing findings: {e}");
            outcome.errors += 1;
            return;
        }
        outcome.findings += 1;
    }
}
