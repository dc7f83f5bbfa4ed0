//! The `crossguard` binary: parse the command line, set up logging, run one command.

use std::process::ExitCode;

use clap::Parser;
use gateway::cli::{Cli, Command, RulesCommand};
use gateway::commands;
use gateway::config::Config;

fn main() -> ExitCode {
    let cli = Cli::parse();
    gateway::logging::init();
    match cli.command {
        Command::Serve { config } => {
            let config = match Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => return fail(&e),
            };
            match runtime.block_on(gateway::server::run(config, shutdown_signal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
        Command::CheckConfig { config } => match Config::load(config.as_deref()) {
            Ok(c) => {
                // The store's `Debug` masks its URL's password (config/summary.rs).
                println!(
                    "ok: listen {}, {} tenant(s), {} model(s), store {:?}",
                    c.listen,
                    c.tenants.len(),
                    c.models.len(),
                    c.store
                );
                println!("{}", c.summary());
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Command::Rules(RulesCommand::Check { dir }) => commands::rules::check(&dir.unwrap_or_default()),
        Command::Rules(RulesCommand::Test { dir }) => commands::rules::test(&dir.unwrap_or_default()),
        Command::Rules(RulesCommand::ImportGitleaks { file }) => commands::rules::import_gitleaks(&file),
        Command::Scan { rules, input_jsonl, read_encoded, files } => {
            commands::scan::scan(&commands::scan::ScanArgs { rules, files, input_jsonl, read_encoded })
        }
    }
}

fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("crossguard: error: {error}");
    ExitCode::from(2)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
