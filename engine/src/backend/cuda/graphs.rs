//! CUDA graphs of whole steps: a decode step is ~400 kernel launches, which cost more
//! host time than the H200 needs to run them, so a step whose shape repeats is captured
//! once and replayed as a single launch.
//!
//! A step's kernels take the same arguments whenever its [`GraphKey`] is the same: the
//! per-step values (token ids, positions, block tables, owner tags, logit adjustments)
//! live in device buffers the host fills before the replay, and the scalars the kernels
//! take are all in the key. A shape is captured the second time in a row it is seen, so
//! the first run of a shape (which compiles kernels and sizes buffers) is never captured
//! and a step of a one-off shape (a prefill chunk) runs launch by launch.
//!
//! Invariants: the caller drops every graph ([`StepGraphs::invalidate`]) before any
//! buffer a graph reads or writes is reallocated; capture uses the one engine stream and
//! always ends, failed or not, so the stream is never left capturing; a capture the
//! driver refuses switches graphs off for the engine's life, with a log line, and the
//! step runs launch by launch.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags_enum, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use super::device::cuda_error;
use crate::error::Result;

/// Graphs kept at once; decode batches of every size from 1 to this many fit.
const MAX_GRAPHS: usize = 512;

/// What fixes every kernel argument of a step, given fixed buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct GraphKey {
    pub rows: usize,
    pub live: usize,
    /// The attention workspace's per-row length (a bucket, not the exact longest row).
    pub max_visible: usize,
    /// Greedy picks made on the device, with this many top logits (`None`: no picks).
    pub picks: Option<usize>,
}

/// A captured step. `CudaGraph` holds raw driver handles and is not `Send`.
struct Graph(CudaGraph);

// SAFETY: a graph is created, launched and dropped only through `StepGraphs`, which the
// forward pass keeps inside its workspace mutex, so no two threads ever touch one graph;
// the driver allows a graph to be used from any thread when calls are serialised.
unsafe impl Send for Graph {}

/// The captured steps of one GPU model.
pub(crate) struct StepGraphs {
    enabled: bool,
    graphs: HashMap<GraphKey, Graph>,
    /// The shape of the step before, captured if the next step repeats it.
    last: Option<GraphKey>,
    pub replays: u64,
}

impl StepGraphs {
    pub fn new(enabled: bool) -> StepGraphs {
        StepGraphs { enabled, graphs: HashMap::new(), last: None, replays: 0 }
    }

    /// Drops every graph: a buffer they use is about to move.
    pub fn invalidate(&mut self) {
        self.graphs.clear();
        self.last = None;
    }

    /// Runs a step whose kernels `launch` issues on `stream`: replays its graph, captures
    /// one when `key` repeats the step before, or launches directly.
    pub fn run(
        &mut self,
        stream: &Arc<CudaStream>,
        key: GraphKey,
        launch: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        if !self.enabled {
            return launch();
        }
        if let Some(graph) = self.graphs.get(&key) {
            self.replays += 1;
            return graph.0.launch().map_err(cuda_error("graph launch"));
        }
        if self.last.replace(key) != Some(key) {
            return launch();
        }
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(cuda_error("graph capture"))?;
        let launched = launch();
        // Always ended, so that a failed launch does not leave the stream capturing.
        let captured = stream.end_capture(CUgraphInstantiate_flags_enum(0));
        launched?;
        match captured {
            Ok(Some(graph)) => {
                graph.launch().map_err(cuda_error("graph launch"))?;
                if self.graphs.len() >= MAX_GRAPHS {
                    self.graphs.clear();
                }
                self.graphs.insert(key, Graph(graph));
                Ok(())
            }
            refused => {
                // Nothing captured ran: run the step as it was issued, and stop capturing.
                let reason = refused.err().map_or_else(|| "the driver returned no graph".to_owned(), |e| e.to_string());
                tracing::warn!(%reason, "CUDA graph capture failed; decode steps run launch by launch from now on");
                self.enabled = false;
                self.invalidate();
                launch()
            }
        }
    }
}
