//! A small persistent thread pool, and disjoint parallel writes into one output matrix.
//!
//! Owns: the worker threads of one engine (spawned once, parked when idle) and the only
//! code that lets several threads write one `&mut [f32]` at once.
//!
//! Why not `std::thread::scope` per call: a forward pass dispatches ~150 parallel steps
//! per token; spawning threads for each would cost more than the work. Why not rayon:
//! its work-stealing adds latency per step that matters at ~50 µs per matrix product, and
//! a fixed pool sized by `EngineOptions.threads` is what the benchmarks compare.
//!
//! Invariants: [`ThreadPool::run`] returns only after every worker has finished with the
//! job (even if the caller's share panics), so a job may borrow from the caller's stack.
//! [`ThreadPool::par_tiles`] hands each tile of the output to exactly one task.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// How long an idle worker spins before parking: long enough to bridge the gap between
/// two steps of one forward pass, short enough not to burn a core between requests.
const SPIN_ROUNDS: usize = 20_000;

type Job = dyn Fn(usize) + Sync;

/// A task of [`ThreadPool::par_tiles`]: (rows, columns, the tile to write).
pub type TileTask<'t> = dyn Fn(Range<usize>, Range<usize>, &mut Tile<'_>) + Sync + 't;

struct Shared {
    /// Bumped once per job; workers watch it.
    generation: AtomicUsize,
    /// Workers that have not yet finished the current job.
    pending: AtomicUsize,
    /// Workers parked on `wake`.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    /// The current job, lifetime-erased; written only while no worker runs.
    job: UnsafeCell<Option<*const Job>>,
}

// SAFETY: `job` is written by the one dispatching thread only while `pending == 0` (no
// worker reads it), and published to workers through the `generation` Release/Acquire
// pair; the pointee is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads; the calling thread takes part as worker 0.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `run` callers: one job at a time.
    dispatch: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("threads", &self.threads()).finish()
    }
}

impl ThreadPool {
    /// A pool of `threads` (at least 1) including the caller.
    pub fn new(threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            job: UnsafeCell::new(None),
        });
        let workers = (1..threads.max(1))
            .filter_map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("engine-cpu-{index}"))
                    .spawn(move || worker(&shared, index))
                    .ok()
            })
            .collect();
        ThreadPool { shared, workers, dispatch: Mutex::new(()) }
    }

    /// Threads that run each job (workers plus the caller).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `job(i)` for every thread index `i` in `0..threads()`, the caller as 0, and
    /// returns when all are done.
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            job(0);
            return;
        }
        let _one_at_a_time = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: no worker reads `job` now (pending == 0 since the previous `run`
        // waited); erasing the lifetime is sound because the guard below waits for every
        // worker to finish before this frame (and `job`'s borrow) ends.
        unsafe {
            let erased: *const Job = std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(job);
            *s.job.get() = Some(erased);
        }
        s.pending.store(self.workers.len(), Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let _wait = WaitGuard(s);
        job(0);
    }

    /// Splits the `[rows, cols]` row-major matrix `out` into tiles of `row_step` rows by
    /// `col_step` columns and calls `task(rows, cols, tile)` once per tile, in parallel.
    /// Tiles are claimed dynamically, so a busy core slows its share, not the whole step.
    pub fn par_tiles(
        &self,
        out: &mut [f32],
        cols: usize,
        row_step: usize,
        col_step: usize,
        task: &TileTask<'_>,
    ) {
        let col_step = col_step.max(1);
        let span = |i: usize| i * col_step..((i + 1) * col_step).min(cols);
        self.par_grid(out, cols, row_step, cols.div_ceil(col_step), &span, &|rows, i, tile| task(rows, span(i), tile));
    }

    /// Like [`par_tiles`](Self::par_tiles) with explicit column spans: calls
    /// `task(rows, i, tile)` for every tile of `row_step` rows by `spans[i]`. The spans
    /// must be ascending, disjoint and inside `cols`; returns `false` (running nothing)
    /// when they are not.
    pub fn par_spans(
        &self,
        out: &mut [f32],
        cols: usize,
        row_step: usize,
        spans: &[Range<usize>],
        task: &(dyn Fn(Range<usize>, usize, &mut Tile<'_>) + Sync),
    ) -> bool {
        let ordered = spans.iter().all(|s| s.start <= s.end) && spans.windows(2).all(|w| w[0].end <= w[1].start);
        if !ordered || spans.last().is_some_and(|s| s.end > cols) {
            return false;
        }
        self.par_grid(out, cols, row_step, spans.len(), &|i| spans[i].clone(), task);
        true
    }

    /// The shared loop: tiles are (row block, span index) pairs, claimed through one
    /// atomic counter. `span(i)` must give disjoint in-bounds column ranges.
    fn par_grid(
        &self,
        out: &mut [f32],
        cols: usize,
        row_step: usize,
        n_spans: usize,
        span: &(dyn Fn(usize) -> Range<usize> + Sync),
        task: &(dyn Fn(Range<usize>, usize, &mut Tile<'_>) + Sync),
    ) {
        let rows = out.len().checked_div(cols).unwrap_or(0);
        let row_step = row_step.max(1);
        let tiles = rows.div_ceil(row_step) * n_spans;
        let next = AtomicUsize::new(0);
        let base = SendPtr(out.as_mut_ptr());
        let claim = |_| loop {
            let t = next.fetch_add(1, Ordering::Relaxed);
            if t >= tiles {
                break;
            }
            let r0 = (t / n_spans) * row_step;
            let (r, i) = (r0..(r0 + row_step).min(rows), t % n_spans);
            let mut tile = Tile { base: base.get(), cols, rows: r.clone(), span: span(i), _out: std::marker::PhantomData };
            task(r, i, &mut tile);
        };
        if tiles <= 1 {
            // One tile: waking the workers would cost more than it could save.
            claim(0);
        } else {
            self.run(&claim);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Waits for all workers of the current job, also when the caller's share unwinds.
struct WaitGuard<'a>(&'a Shared);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut spins = 0usize;
        while self.0.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < SPIN_ROUNDS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

fn worker(s: &Shared, index: usize) {
    // Generation 0 is the state before any job: a worker that starts after the first
    // `run` has already bumped the counter must still take that job.
    let mut seen = 0;
    loop {
        let mut spins = 0usize;
        while s.generation.load(Ordering::Acquire) == seen && spins < SPIN_ROUNDS {
            std::hint::spin_loop();
            spins += 1;
        }
        if s.generation.load(Ordering::Acquire) == seen {
            let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while s.generation.load(Ordering::SeqCst) == seen {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        seen = s.generation.load(Ordering::Acquire);
        if s.shutdown.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: the dispatcher wrote `job` before bumping `generation` (Acquire above)
        // and keeps the closure alive until `pending` reaches 0, which happens below.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // A panicking job must still release the dispatcher.
            // SAFETY: see above; the pointee outlives this call.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job)(index) }));
        }
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

impl SendPtr {
    /// A method, not a field access, so closures capture the `Sync` wrapper.
    fn get(&self) -> *mut f32 {
        self.0
    }
}
// SAFETY: the pointer is only used to build `Tile`s over disjoint regions (see `Tile`).
unsafe impl Sync for SendPtr {}
// SAFETY: as above.
unsafe impl Send for SendPtr {}

/// Exclusive access to one tile (`rows x span`) of the output matrix of `par_tiles`.
pub struct Tile<'a> {
    base: *mut f32,
    cols: usize,
    rows: Range<usize>,
    span: Range<usize>,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

impl Tile<'_> {
    /// The tile's part of output row `row` (which must be in the tile's row range):
    /// `out[row * cols + span]`.
    pub fn row(&mut self, row: usize) -> &mut [f32] {
        if !self.rows.contains(&row) {
            return &mut [];
        }
        // SAFETY: `row` is in this tile's rows and `span` within `cols`, so the range is
        // inside `out`; each (row, span) region belongs to exactly one tile, claimed by
        // one task through the atomic counter, and `&mut self` prevents aliasing within it.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(row * self.cols + self.span.start), self.span.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_index_runs_once() {
        for threads in 1..4 {
            let pool = ThreadPool::new(threads);
            let hits: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..100 {
                pool.run(&|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 100));
        }
    }

    #[test]
    fn tiles_cover_the_matrix_exactly_once() {
        let pool = ThreadPool::new(3);
        let (rows, cols) = (7, 13);
        let mut out = vec![0.0f32; rows * cols];
        pool.par_tiles(&mut out, cols, 3, 4, &|r, c, tile| {
            for row in r {
                for (j, v) in tile.row(row).iter_mut().enumerate() {
                    *v += (row * cols + c.start + j) as f32;
                }
            }
        });
        assert!(out.iter().enumerate().all(|(i, v)| *v == i as f32));
    }

    #[test]
    fn spans_cover_their_columns_once_and_bad_spans_are_refused() {
        let pool = ThreadPool::new(2);
        let (rows, cols) = (5, 10);
        let mut out = vec![0.0f32; rows * cols];
        let spans = [0..3, 3..4, 6..10];
        assert!(pool.par_spans(&mut out, cols, 2, &spans, &|r, i, tile| {
            for row in r {
                tile.row(row).iter_mut().for_each(|v| *v += 1.0 + i as f32);
            }
        }));
        for row in out.chunks_exact(cols) {
            assert_eq!(row, &[1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 3.0, 3.0, 3.0, 3.0]);
        }
        let out_of_bounds = [Range { start: 8, end: 11 }];
        for bad in [&[0..3, 2..4][..], &[4..6, 0..2], &out_of_bounds] {
            assert!(!pool.par_spans(&mut out, cols, 2, bad, &|_, _, _| {}));
        }
    }

    #[test]
    fn tile_refuses_rows_outside_it() {
        let pool = ThreadPool::new(1);
        let mut out = vec![0.0f32; 4];
        pool.par_tiles(&mut out, 2, 1, 2, &|r, _, tile| {
            assert!(tile.row(r.start + 1).is_empty());
        });
    }
}
