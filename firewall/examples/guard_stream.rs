//! The firewall as a library: a response streamed through a [`StreamScanner`] in small
//! pieces, as a model would emit it, with the built-in rules (or a rule folder). What the
//! scanner releases is printed as it comes; a finding that blocks stops the stream there,
//! before a complete secret has been released.
//!
//! ```sh
//! cargo run -p crossguard-firewall --example guard_stream                  # a demo response
//! echo "the key is AKIAZ7Q3XN5M2VW4KPLR" | cargo run -p crossguard-firewall --example guard_stream -- -
//! cargo run -p crossguard-firewall --example guard_stream -- FILE [RULES_DIR]
//! ```
use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;

use firewall::{Action, Detectors, Ruleset, ScanContext, StreamScanner};

const DEMO: &str = "Sure! Configure the client like this:\n\n\
    ```python\nclient = Client(api_key=\"sk-proj-Xq7RmT2vLk9pW4zNc8BaJ1dHf5GyUe3sKo6QiVt0\")\n```\n\n\
    Then call `client.run()`.\n";

/// How many bytes the demo hands the scanner at a time (a model's token is a few bytes).
const PIECE: usize = 5;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let text = match args.first().map(String::as_str) {
        None => DEMO.to_owned(),
        Some("-") => {
            let mut s = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut s) {
                eprintln!("stdin: {e}");
                return ExitCode::from(2);
            }
            s
        }
        Some(path) => match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{path}: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let loaded = match args.get(1) {
        Some(dir) => Ruleset::load_dir(std::path::Path::new(dir)),
        None => Ruleset::builtin(),
    };
    let rules = match loaded {
        Ok(r) => Arc::new(r),
        Err(e) => {
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };

    let mut scanner = StreamScanner::new(rules, ScanContext::new("demo-tenant"), Arc::new(Detectors::default()));
    let mut pieces = text.char_indices().map(|(i, _)| i).step_by(PIECE).collect::<Vec<_>>();
    pieces.push(text.len());
    for w in pieces.windows(2) {
        let step = scanner.push(&text[w[0]..w[1]]);
        print!("{}", step.release);
        for f in &step.findings {
            eprintln!("\n[firewall] {} ({:?}, {:?}): {}", f.rule_id, f.severity, f.action, f.excerpt);
        }
        if step.action == Action::Block {
            eprintln!("[firewall] stream blocked; the rest is not sent");
            return ExitCode::from(1);
        }
    }
    let last = scanner.finish();
    print!("{}", last.release);
    for f in &last.findings {
        eprintln!("\n[firewall] {} ({:?}, {:?}): {}", f.rule_id, f.severity, f.action, f.excerpt);
    }
    if last.action == Action::Block {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
