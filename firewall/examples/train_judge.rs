//! Trains the generic-secret judge (`firewall/data/judge.toml`).
//!
//! ```sh
//! find ~/.cargo/registry/src -type f \( -name '*.rs' -o -name '*.toml' -o -name '*.md' -o -name '*.json' \
//!     -o -name '*.yml' -o -name '*.py' -o -name '*.sh' -o -name '*.txt' \) -size -2M > /tmp/reg-files.txt
//! find /etc -type f -size -512k | xargs grep -lI . > /tmp/etc-files.txt
//! cargo run --release -p crossguard-firewall --example train_judge -- --rules rules \
//!     $(for f in firewall/tests/corpus/*.jsonl; do echo --labelled $f; done) \
//!     --labelled firewall/tests/peers/tuning.jsonl \
//!     --clean-list /tmp/reg-files.txt --clean-list /tmp/etc-files.txt --out firewall/data/judge.toml
//! ```
//!
//! Never the held-back split, and never this machine's Python: the first measures the
//! rules, the second how quiet they stay on real code nobody labelled.
//!
//! Candidates are what the generic rules (tagged `generic`, and any rule that asks the
//! judge with `judge = …`) match, before their
//! `allow`, `allow_line` and `min_entropy` filters: a superset of what the judge sees when
//! scanning, where those filters run first. Real files hold few matches that get past the
//! filters; the placeholders and identifiers they stop teach the judge what a value that is
//! no secret looks like.
//! A candidate in a labelled text (`{"text", "secrets": [{"start", "end"} | {"value"}]}`)
//! is a credential when it overlaps an expected secret (or, for a secret given by value
//! only, holds it or is held by it); a text with a secret given neither way is skipped.
//! Every candidate in a clean file (real source code: `--clean-list` names the files) is
//! not one. The letter-pair table comes from the clean files, so "code- or English-like"
//! means like them. The fit is an L2-regularised logistic regression with the two classes
//! weighted equally, by full-batch gradient descent on standardised features.

use std::path::PathBuf;
use std::process::ExitCode;

use firewall::{judge_context, letter_pairs, Judge, LoadOptions, RuleFiles, Ruleset, JUDGE_FEATURES};

const N: usize = JUDGE_FEATURES.len();

struct Args {
    rules: PathBuf,
    labelled: Vec<PathBuf>,
    clean_lists: Vec<PathBuf>,
    out: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { rules: "rules".into(), labelled: Vec::new(), clean_lists: Vec::new(), out: "judge.toml".into() };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--rules" => a.rules = value()?.into(),
            "--labelled" => a.labelled.push(value()?.into()),
            "--clean-list" => a.clean_lists.push(value()?.into()),
            "--out" => a.out = value()?.into(),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// One candidate: its text, where the value lies, and where the match starts.
struct Candidate<'t> {
    text: &'t str,
    match_start: usize,
    value: (usize, usize),
}

/// What the generic and judge-asking rules match in `text`: more of the same kind of
/// candidate than the judge's own rules give alone.
fn candidates<'t>(rules: &Ruleset, text: &'t str) -> Vec<Candidate<'t>> {
    let mut out = Vec::new();
    for r in rules.rules().iter().filter(|r| r.judge.is_some() || r.tags.iter().any(|t| t == "generic")) {
        let Some(regex) = r.regex.get() else { continue };
        for caps in regex.captures_iter(text) {
            let (Some(m), Some(s)) = (caps.get_match(), caps.get_group(r.secret_group())) else { continue };
            out.push(Candidate { text, match_start: m.start(), value: (s.start, s.end) });
        }
    }
    out
}

/// Labels of a labelled record's candidates; None when they cannot be told: a secret
/// given by neither span nor value in a text that holds others, or a placeholder-shaped one.
fn labels(record: &serde_json::Value, found: &[Candidate<'_>]) -> Option<Vec<bool>> {
    let secrets = record.get("secrets")?.as_array()?;
    let mut spans = Vec::new();
    let mut values = Vec::new();
    for s in secrets {
        match (s.get("start").and_then(|v| v.as_u64()), s.get("end").and_then(|v| v.as_u64())) {
            (Some(a), Some(b)) => spans.push((a as usize, b as usize)),
            _ => match s.get("value").and_then(|v| v.as_str()) {
                Some(v) => values.push(v.to_string()),
                // A peer's example: the text is written around its one secret, so what the
                // rules find there is it (as the evaluation counts it), unless the text
                // is made up of placeholders, which crossguard leaves alone on purpose.
                None if secrets.len() == 1 && !placeholder_shaped(record.get("text")?.as_str()?) => {
                    return Some(vec![true; found.len()]);
                }
                None => return None,
            },
        }
    }
    Some(
        found
            .iter()
            .map(|c| {
                let v = &c.text[c.value.0..c.value.1];
                spans.iter().any(|&(a, b)| c.value.0 < b && a < c.value.1)
                    || values.iter().any(|w| w.len() >= 4 && (w.contains(v) || v.contains(w.as_str())))
            })
            .collect(),
    )
}

/// The evaluation's placeholder test (`scripts/corpus/eval_peers.py`): a placeholder
/// word, one character four times running, or four counting characters in a row.
fn placeholder_shaped(text: &str) -> bool {
    let low = text.to_ascii_lowercase();
    let words = ["example", "sample", "dummy", "fake", "your", "xxxx"];
    let b = low.as_bytes();
    let counting = ["0123456789", "abcdefghijklmnopqrstuvwxyz"].iter().any(|run| {
        let rev: String = run.chars().rev().collect();
        [run.to_string(), rev]
            .iter()
            .any(|seq| seq.as_bytes().windows(4).any(|w| low.contains(std::str::from_utf8(w).unwrap_or("\0"))))
    });
    let alnum: String = low.chars().filter(char::is_ascii_alphanumeric).collect();
    words.iter().any(|w| low.contains(w))
        || b.windows(4).any(|w| w[0].is_ascii_alphanumeric() && w.iter().all(|&c| c == w[0]))
        || counting
        || alnum.contains("a1b2c3")
        || alnum.contains("1a2b3c")
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train_judge: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let a = parse_args()?;
    let opts = LoadOptions { check_samples: false, defer_streaming: true, defer_regexes: false };
    let rules = Ruleset::load(&RuleFiles::Folder(a.rules.clone()), &[], opts).map_err(|e| e.to_string())?;
    let mut clean: Vec<String> = Vec::new();
    for list in &a.clean_lists {
        let paths = std::fs::read_to_string(list).map_err(|e| format!("{}: {e}", list.display()))?;
        clean.extend(paths.lines().filter_map(|p| std::fs::read_to_string(p).ok()));
    }
    let pairs = letter_pairs(&clean.iter().map(String::as_str).collect::<Vec<_>>());
    let scorer = Judge::from_parts([0.0; N], [1.0; N], [0.0; N], 0.0, pairs.clone());
    let mut xs: Vec<[f32; N]> = Vec::new();
    let mut ys: Vec<bool> = Vec::new();
    let mut add = |c: &Candidate<'_>, y: bool| {
        let ctx = judge_context(c.text, c.match_start, c.value.0);
        xs.push(scorer.features(ctx, &c.text[c.value.0..c.value.1]));
        ys.push(y);
    };
    let mut skipped = 0;
    for path in &a.labelled {
        let body = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for (n, line) in body.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let rec: serde_json::Value =
                serde_json::from_str(line).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?;
            let Some(text) = rec.get("text").and_then(|t| t.as_str()) else { continue };
            let found = candidates(&rules, text);
            match labels(&rec, &found) {
                Some(ls) => found.iter().zip(ls).for_each(|(c, y)| add(c, y)),
                None => skipped += 1,
            }
        }
    }
    for text in &clean {
        candidates(&rules, text).iter().for_each(|c| add(c, false));
    }
    let positives = ys.iter().filter(|&&y| y).count();
    eprintln!(
        "{} candidates: {positives} credentials, {} not; {skipped} labelled texts skipped (secret without span or value)",
        ys.len(),
        ys.len() - positives
    );
    if positives == 0 || positives == ys.len() {
        return Err("need candidates of both kinds".into());
    }
    let judge = fit(&xs, &ys, pairs);
    let correct = xs.iter().zip(&ys).filter(|(x, &y)| (judge.score_features(x) >= 0.5) == y).count();
    let kept_pos = xs.iter().zip(&ys).filter(|(x, &y)| y && judge.score_features(x) >= 0.5).count();
    let kept_neg = xs.iter().zip(&ys).filter(|(x, &y)| !y && judge.score_features(x) >= 0.5).count();
    eprintln!(
        "on the training candidates at 0.5: accuracy {:.4}, credentials kept {kept_pos}/{positives}, others kept {kept_neg}/{}",
        correct as f64 / ys.len() as f64,
        ys.len() - positives
    );
    let header = "# The generic-secret judge's model (firewall/src/scan/judge.rs), written by\n\
                  # firewall/examples/train_judge.rs (its doc gives the command); retrain, do not edit.\n";
    std::fs::write(&a.out, format!("{header}{}", judge.to_toml())).map_err(|e| format!("{}: {e}", a.out.display()))
}

/// L2-regularised logistic regression, classes weighted equally.
fn fit(xs: &[[f32; N]], ys: &[bool], pairs: Vec<f32>) -> Judge {
    let n = xs.len() as f64;
    let mut mean = [0f32; N];
    let mut scale = [1f32; N];
    for j in 0..N {
        let m = xs.iter().map(|x| f64::from(x[j])).sum::<f64>() / n;
        let var = xs.iter().map(|x| (f64::from(x[j]) - m).powi(2)).sum::<f64>() / n;
        mean[j] = m as f32;
        scale[j] = if var > 1e-12 { var.sqrt() as f32 } else { 1.0 };
    }
    let z: Vec<[f64; N]> = xs.iter().map(|x| std::array::from_fn(|j| f64::from((x[j] - mean[j]) / scale[j]))).collect();
    let pos = ys.iter().filter(|&&y| y).count() as f64;
    let (w_pos, w_neg) = (n / (2.0 * pos), n / (2.0 * (n - pos)));
    let (mut w, mut b) = ([0f64; N], 0f64);
    let (lambda, rate) = (1e-3, 0.5);
    for _ in 0..3000 {
        let (mut gw, mut gb) = ([0f64; N], 0f64);
        for (x, &y) in z.iter().zip(ys) {
            let s = b + (0..N).map(|j| w[j] * x[j]).sum::<f64>();
            let p = 1.0 / (1.0 + (-s).exp());
            let err = (p - f64::from(u8::from(y))) * if y { w_pos } else { w_neg };
            for j in 0..N {
                gw[j] += err * x[j];
            }
            gb += err;
        }
        for j in 0..N {
            w[j] -= rate * (gw[j] / n + lambda * w[j]);
        }
        b -= rate * gb / n;
    }
    for (name, wj) in JUDGE_FEATURES.iter().zip(w) {
        eprintln!("  {name:>18} {wj:+.3}");
    }
    Judge::from_parts(mean, scale, w.map(|v| v as f32), b as f32, pairs)
}
