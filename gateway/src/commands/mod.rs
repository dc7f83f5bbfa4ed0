//! The command-line tools beside `serve`: rule-file checks and one-shot scans. Each
//! returns the process exit code and writes results to stdout, problems to stderr.

pub mod rules;
pub mod scan;
