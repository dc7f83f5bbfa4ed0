//! Reloads the firewall rules when the rule folder changes, as the admin API's reload
//! does: a security engineer drops a tested rule file into `[firewall] rules_dir`, and the
//! responses that start after the reload are scanned with it.
//!
//! It polls. Every `watch_interval_ms` it reads the folder's rule files (exactly what a
//! reload loads) and compares them with what it saw last; only a difference reloads.
//! Polling sees every change on every filesystem, network mounts and folders swapped
//! through a symlink (a Kubernetes ConfigMap) included, where change notifications may
//! miss some; a rule folder is a few hundred KB, read in well under a millisecond.
//!
//! A file caught half-written does not load, and the running rules stay (the reload logs
//! every error with file:line); the finished write changes the files again and reloads.
//! Each state of the folder is tried once, so a broken file is reported once, not every
//! tick.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use firewall::{RuleSource, Ruleset};

use crate::protection::every;
use crate::state::AppState;

/// What the folder held at a look: its rule files, or why it could not be read.
type Seen = Result<Vec<RuleSource>, String>;

/// Starts watching `state`'s rule folder, if it has one and watching is on; the task ends
/// with the state.
pub fn spawn(state: &Arc<AppState>) {
    let firewall = &state.config.firewall;
    let (Some(dir), period) = (firewall.rules_dir.clone(), firewall.watch_interval_ms) else { return };
    if period == 0 {
        return;
    }
    // What the rules just loaded came from (read again: the window is start-up's few
    // milliseconds).
    let seen = Arc::new(Mutex::new(look(&dir)));
    tracing::info!(dir = %dir.display(), interval_ms = period, "watching the rule folder");
    every(Arc::downgrade(state), Duration::from_millis(period), move |state| {
        let (dir, seen) = (dir.clone(), seen.clone());
        async move {
            // Reading the files and compiling the rules is blocking work.
            let _ = tokio::task::spawn_blocking(move || check(&state, &dir, &seen)).await;
        }
    });
}

fn look(dir: &Path) -> Seen {
    Ruleset::dir_sources(dir).map_err(|e| e.to_string())
}

/// One look: reloads when the folder's files differ from the last look.
fn check(state: &AppState, dir: &Path, seen: &Mutex<Seen>) {
    let now = look(dir);
    let mut last = seen.lock().unwrap_or_else(PoisonError::into_inner);
    if *last == now {
        return;
    }
    match &now {
        Ok(_) => {
            if let Err(errors) = super::reload(state, "rule folder watch") {
                for e in &errors.errors {
                    tracing::warn!(error = %e, "rule file not loaded");
                }
            }
        }
        Err(why) => {
            tracing::warn!(dir = %dir.display(), error = %why.trim_end(), "rule folder unreadable; the running rules stay")
        }
    }
    *last = now;
}
