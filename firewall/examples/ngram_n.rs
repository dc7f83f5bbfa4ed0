//! Measures how the n-gram window size trades sensitivity for false alarms.
//!
//! Treats every text file given (or found under the folders given) as one tenant's data,
//! fingerprints each with the firewall's own normaliser, and reports, per n, the share of a
//! document's n-grams that also occur in another document: all of them, and those left
//! after the "common" filter (shared by fewer than 3 documents) — the ones that would be
//! false foreign-n-gram alarms between unrelated tenants. Then the same for token words
//! (`token_fingerprints`, the `foreign-token` check): how many documents hold one, and how
//! many hold one that exactly one other document holds too (a false alarm between two
//! unrelated tenants; three or more is common language).
//!
//! `cargo run --release -p crossguard-firewall --example ngram_n -- DIR_OR_FILE...`

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use firewall::{fingerprints, token_fingerprints, NgramKey};

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            collect(&e.path(), out);
        }
    } else if p.extension().is_some_and(|x| x == "md" || x == "txt") {
        out.push(p.to_path_buf());
    }
}

fn main() {
    let mut files = Vec::new();
    for a in std::env::args().skip(1) {
        collect(Path::new(&a), &mut files);
    }
    let docs: Vec<String> =
        files.iter().filter_map(|f| std::fs::read_to_string(f).ok()).filter(|t| t.len() > 500).collect();
    println!("{} documents, {} bytes", docs.len(), docs.iter().map(String::len).sum::<usize>());
    let key = NgramKey([9; 16]);
    println!("n\tngrams\tshared_any\tshared_rare(<3 docs)");
    for n in 3..=12 {
        let sets: Vec<HashSet<u64>> = docs.iter().map(|d| fingerprints(d, &key, n).into_iter().collect()).collect();
        let mut owners: HashMap<u64, usize> = HashMap::new();
        for s in &sets {
            for h in s {
                *owners.entry(*h).or_default() += 1;
            }
        }
        let total: usize = sets.iter().map(HashSet::len).sum();
        let shared = sets.iter().flatten().filter(|h| owners[h] >= 2).count();
        let rare = sets.iter().flatten().filter(|h| (2..3).contains(&owners[h])).count();
        println!(
            "{n}\t{total}\t{:.4}%\t{:.4}%",
            100.0 * shared as f64 / total.max(1) as f64,
            100.0 * rare as f64 / total.max(1) as f64
        );
    }
    let sets: Vec<HashSet<u64>> = docs.iter().map(|d| token_fingerprints(d, &key).into_iter().collect()).collect();
    let mut owners: HashMap<u64, usize> = HashMap::new();
    for h in sets.iter().flatten() {
        *owners.entry(*h).or_default() += 1;
    }
    let with_tokens = sets.iter().filter(|s| !s.is_empty()).count();
    let with_rare = sets.iter().filter(|s| s.iter().any(|h| owners[h] == 2)).count();
    println!(
        "tokens: {} distinct in {with_tokens} documents; {} shared by exactly 2 documents, {} by 3 or more; \
         {with_rare} documents ({:.3}%) hold a token exactly one other document holds",
        owners.len(),
        owners.values().filter(|&&n| n == 2).count(),
        owners.values().filter(|&&n| n >= 3).count(),
        100.0 * with_rare as f64 / docs.len().max(1) as f64
    );
}
