//! Measures the false alarms that reading rewritten text (backwards, ROT13) adds to the
//! foreign n-gram and token checks, on data nobody here wrote.
//!
//! Every file given, and every `.md`, `.txt`, `README*` and `changelog*` file under the
//! folders given, over 500 bytes of UTF-8, is a document. Every other document (in path order) is a
//! tenant of its own and records its n-grams and tokens as the gateway records a prompt; the
//! others are scanned as answers to one more tenant, with the firewall's n-gram detector (8
//! words, common at 3 tenants): every foreign finding is a false alarm between unrelated
//! tenants. Printed: documents with a finding read as written (boilerplate copied between
//! two documents: the detector's own false alarms), and documents with a finding only a
//! rewritten reading made (what `NgramConfig::rewrites` adds). Then every document records
//! as a tenant of its own and is scanned as an answer to that tenant: read as written it is
//! all its own, so every finding there is a rewritten reading matching another document.
//!
//! `cargo run --release -p crossguard-firewall --example rewrite_alarms -- DIR_OR_FILE... [@LIST]`
//! (`@LIST`: a file naming one file per line).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use firewall::{
    fingerprints_and_tokens, Detectors, Finding, NgramConfig, NgramKey, NgramOwners, OwnerSet, Ruleset, ScanContext,
};

/// Files under a folder that read as documents; a file named on the command line is taken
/// whatever its name.
fn collect(p: &Path, named: bool, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            collect(&e.path(), false, out);
        }
    } else {
        let name = p.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        let doc = [".md", ".txt"].iter().any(|x| name.ends_with(x))
            || ["readme", "changelog"].iter().any(|x| name.starts_with(x));
        if named || doc {
            out.push(p.to_path_buf());
        }
    }
}

#[derive(Default)]
struct Index(HashMap<u64, OwnerSet>);

impl Index {
    /// Every `step`-th document's n-grams and tokens, each document a tenant (`doc{i}`).
    fn of(docs: &[(PathBuf, String)], step: usize, key: &NgramKey) -> Index {
        let mut index = Index::default();
        for (i, (_, d)) in docs.iter().enumerate().step_by(step) {
            let (ngrams, tokens) = fingerprints_and_tokens(d, key, firewall::DEFAULT_NGRAM_WORDS);
            let mut hashes: Vec<u64> = ngrams.into_iter().chain(tokens).collect();
            hashes.sort_unstable();
            hashes.dedup();
            for h in hashes {
                let e = index.0.entry(h).or_default();
                if e.tenants.len() < 8 {
                    e.tenants.push(format!("doc{i}"));
                }
                e.shared_by += 1;
            }
        }
        index
    }
}

impl NgramOwners for Index {
    fn owners(&self, hash: u64) -> OwnerSet {
        self.0.get(&hash).cloned().unwrap_or_default()
    }
}

fn main() {
    let mut files = Vec::new();
    for a in std::env::args().skip(1) {
        match a.strip_prefix('@') {
            Some(list) => {
                let Ok(list) = std::fs::read_to_string(list).map_err(|e| eprintln!("{list}: {e}")) else {
                    std::process::exit(2);
                };
                list.lines().for_each(|f| collect(Path::new(f), true, &mut files));
            }
            None => collect(Path::new(&a), true, &mut files),
        }
    }
    files.sort();
    let docs: Vec<(PathBuf, String)> = files
        .into_iter()
        .filter_map(|f| std::fs::read_to_string(&f).ok().map(|t| (f, t)))
        .filter(|(_, t)| t.len() > 500)
        .collect();
    println!("{} documents, {} bytes", docs.len(), docs.iter().map(|(_, t)| t.len()).sum::<usize>());
    let key = NgramKey([9; 16]);
    let rules = Ruleset::empty();
    for (pass, recorded, tenant) in [("answers to another tenant", 2, None), ("own documents", 1, Some(()))] {
        let index = Arc::new(Index::of(&docs, recorded, &key));
        let detectors = |rewrites: bool| Detectors {
            ngram: Some(NgramConfig { rewrites, ..NgramConfig::new(key, index.clone()) }),
            ..Detectors::default()
        };
        let (plain, rewritten) = (detectors(false), detectors(true));
        let (mut as_written, mut only_rewritten, mut findings, mut scanned) = (0, 0, 0, 0);
        let scanned_docs = docs.iter().enumerate().skip(recorded - 1).step_by(recorded);
        for (i, (path, d)) in scanned_docs {
            let ctx = ScanContext::new(tenant.map_or("reader".to_string(), |()| format!("doc{i}")));
            let before = rules.scan_with(d, &ctx, &plain);
            let after = rules.scan_with(d, &ctx, &rewritten);
            let added: Vec<&Finding> = after.iter().filter(|f| f.encoding.is_some()).collect();
            scanned += 1;
            as_written += usize::from(!before.is_empty());
            only_rewritten += usize::from(!added.is_empty());
            findings += added.len();
            for f in added {
                let text: String = d[f.start..f.end].split_whitespace().collect::<Vec<_>>().join(" ");
                println!("  {:?} in {}: {text}", f.encoding, path.display());
            }
        }
        println!(
            "{pass}: {scanned} documents; with a foreign finding read as written: {as_written}; \
             with one only a rewritten reading made: {only_rewritten} ({findings} findings)"
        );
    }
}
