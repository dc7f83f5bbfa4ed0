//! The command line: `crossguard serve`, and the tools around it.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// crossguard: an OpenAI-compatible gateway that keeps one tenant's data out of another's responses.
#[derive(Debug, Parser)]
#[command(name = "crossguard", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (defaults: 127.0.0.1:8080, embedded storage).
    Serve {
        /// Config file (TOML). Without one, defaults and CROSSGUARD_* variables apply.
        #[arg(long, short, env = "CROSSGUARD_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Validate a config file (and CROSSGUARD_* variables) without starting anything.
    CheckConfig {
        #[arg(long, short, env = "CROSSGUARD_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Work with rule files.
    #[command(subcommand)]
    Rules(RulesCommand),
    /// Scan text files (or `-` for stdin) or a JSONL corpus with the rules; one JSON line per finding.
    Scan {
        /// Rule folder (default: the rules built into the binary).
        #[arg(long)]
        rules: Option<PathBuf>,
        /// Records `{"id": ..., "text": ...}`, one per line; offsets are bytes into `text`.
        #[arg(long, conflicts_with = "files")]
        input_jsonl: Option<PathBuf>,
        /// Also decode base64, hex, percent-encoding, character codes and spelled-out text
        /// and scan what it says;
        /// such findings carry `"encoding"` and span the encoded characters.
        #[arg(long)]
        read_encoded: bool,
        /// Files to scan; `-` reads stdin.
        files: Vec<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Validate every rule file; exit 1 listing every error (file:line, rule id, reason).
    Check {
        /// Rule folder (default: the built-in rules).
        dir: Option<PathBuf>,
    },
    /// Run every rule's must_match / must_not_match samples and report per rule.
    Test {
        /// Rule folder (default: the built-in rules).
        dir: Option<PathBuf>,
    },
    /// Convert a gitleaks TOML config to crossguard rules on stdout; what cannot be converted goes to stderr.
    ImportGitleaks { file: PathBuf },
}
