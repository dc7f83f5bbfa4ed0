//! The response guard on what an upstream may stream besides text: a tool call whose
//! `function.name` comes in thousands of fragments, before its arguments begin and after.
//! Each must cost time linear in what arrives (the guard judges a bounded window, not the
//! whole name again per fragment).
//!
//! Run: `cargo bench -p crossguard --bench guard`.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use firewall::{Detectors, Ruleset, ScanContext};
use gateway::api::response::{FunctionChunk, ToolCallChunk};
use gateway::backend::{BackendEvent, ChoiceDelta};
use gateway::response_guard::{GuardSettings, ResponseGuard};

/// A fragment of tool call 0: part of its name, and arguments or none.
fn fragment(name: &str, arguments: Option<&str>) -> BackendEvent {
    BackendEvent::Delta(ChoiceDelta {
        index: 0,
        tool_calls: vec![ToolCallChunk {
            index: 0,
            id: None,
            kind: None,
            function: FunctionChunk { name: Some(name.to_owned()), arguments: arguments.map(str::to_owned) },
        }],
        ..ChoiceDelta::default()
    })
}

fn tool_name_fragments(c: &mut Criterion) {
    let Ok(rules) = Ruleset::builtin() else { return };
    let settings = GuardSettings::new(Arc::new(rules), ScanContext::new("acme"), Arc::new(Detectors::default()));
    let pieces: Vec<String> = (0..20_000).map(|i| format!("n{i:08}_")).collect();
    let mut g = c.benchmark_group("tool-name-fragments");
    g.sample_size(10).throughput(Throughput::Bytes(pieces.iter().map(|p| p.len() as u64).sum()));
    for (when, announced) in [("after-arguments-began", true), ("before-arguments", false)] {
        g.bench_function(BenchmarkId::new(when, pieces.len()), |b| {
            b.iter(|| {
                let mut guard = ResponseGuard::new(settings.clone());
                if announced {
                    guard.apply(fragment("", Some("")));
                }
                for piece in &pieces {
                    guard.apply(fragment(piece, None));
                }
                guard.apply(BackendEvent::Finish { index: 0, reason: "tool_calls".into() })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, tool_name_fragments);
criterion_main!(benches);
