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
}
