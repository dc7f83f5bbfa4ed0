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
//! Why a late worker does not stall a step: on a shared machine a worker may be
//! descheduled for a whole time slice. Work is claimed tile by tile, so the caller does
//! the tiles itself, then closes the job; only workers that joined before the close are
//! waited for (each is inside a tile it claimed). One that wakes later skips the job.
//!
//! Why the pool sometimes runs alone: a worker descheduled *inside* its tile still holds
//! the step for the rest of another process's time slice (milliseconds, against tens of
//! microseconds for a tile), so on a loaded machine two threads ran slower than one. When
//! the caller spends so much of a 50 ms window waiting for workers that it would have
//! been faster alone (`Straggle`), the pool runs its jobs on the caller alone for a while
//! (doubling, up to a second, while it keeps happening), then tries its workers again:
//! throughput falls back to one thread's, not below it, and brief waits (a low-priority
//! process taking the core now and then) keep every thread.
//!
//! Invariants: `run` returns only after every worker that joined the job has finished
//! with it (even if the caller's share panics), so a job may borrow from the caller's
//! stack; no worker joins a closed job. [`ThreadPool::par_tiles`] hands each tile of the
//! output to exactly one task.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking: long enough to bridge the gap between
/// two steps of one forward pass, short enough not to burn a core between requests.
const SPIN_ROUNDS: usize = 20_000;

/// The job ticket: generation in the high 32 bits, a closed flag, and the count of workers
/// inside the job in the low bits.
const GENERATION_SHIFT: u32 = 32;
const CLOSED: u64 = 1 << 31;
const JOINED: u64 = CLOSED - 1;

type Job = dyn Fn(usize) + Sync;

/// A task of [`ThreadPool::par_tiles`]: (rows, columns, the tile to write).
pub type TileTask<'t, T = f32> = dyn Fn(Range<usize>, Range<usize>, &mut Tile<'_, T>) + Sync + 't;

/// A task of [`ThreadPool::par_spans`]: (rows, span index, the tile to write).
pub type SpanTask<'t, T = f32> = dyn Fn(Range<usize>, usize, &mut Tile<'_, T>) + Sync + 't;

struct Shared {
    /// Generation, closed flag and joined count of the current job (see the constants).
    ticket: AtomicU64,
    /// Workers parked on `wake`.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    /// The current job, lifetime-erased; written only while no worker is joined.
    job: UnsafeCell<Option<*const Job>>,
}

// SAFETY: `job` is written by the one dispatching thread only while the ticket is closed
// with no worker joined, and published with the next generation's Release store; a worker
// reads it only after joining (an Acquire CAS on an open ticket); the pointee is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads; the calling thread takes part as worker 0.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `run` callers (one job at a time) and holds when to run alone.
    dispatch: Mutex<Straggle>,
}

/// How much of the pool's time the caller spends waiting for workers, and for how long
/// the pool runs without them.
#[derive(Debug)]
struct Straggle {
    /// Whether waits switch workers off at all (tests of the protocol turn it off).
    adaptive: bool,
    /// Above this share of a window's time spent waiting, the caller alone is faster.
    max_wait_share: f64,
    /// Jobs run on the caller alone until then.
    solo_until: Option<Instant>,
    /// The next solo period.
    backoff: Duration,
    /// Wall time of the parallel jobs of the current window, and the caller's waits in it.
    busy: Duration,
    waited: Duration,
}

impl Straggle {
    /// Parallel time judged at once: long enough to span several of another process's
    /// time slices, short enough to react within a few tokens.
    const WINDOW: Duration = Duration::from_millis(50);
    const FIRST_SOLO: Duration = Duration::from_millis(20);
    const MAX_SOLO: Duration = Duration::from_secs(1);

    fn new(threads: usize, adaptive: bool) -> Straggle {
        // With no waits, n threads run a step ~0.8 n times faster than one (measured ~1.6x
        // at 2); waiting a share w of the time leaves 0.8 n (1 - w), below 1 past this.
        let max_wait_share = 1.0 - 1.0 / (0.8 * threads.max(2) as f64);
        Straggle {
            adaptive,
            max_wait_share,
            solo_until: None,
            backoff: Straggle::FIRST_SOLO,
            busy: Duration::ZERO,
            waited: Duration::ZERO,
        }
    }

    /// Whether the next job runs on the caller alone.
    fn solo(&mut self) -> bool {
        match self.solo_until {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                self.solo_until = None;
                false
            }
            None => false,
        }
    }

    /// Records a parallel job that took `took` in all, `waited` of it waiting for workers
    /// after the caller's own share; at the end of a window, decides whether to go solo.
    fn record(&mut self, took: Duration, waited: Duration) {
        if !self.adaptive {
            return;
        }
        self.busy += took;
        self.waited += waited;
        if self.busy < Straggle::WINDOW {
            return;
        }
        if self.waited.as_secs_f64() > self.max_wait_share * self.busy.as_secs_f64() {
            self.solo_until = Some(Instant::now() + self.backoff);
            self.backoff = (2 * self.backoff).min(Straggle::MAX_SOLO);
        } else {
            self.backoff = Straggle::FIRST_SOLO;
        }
        (self.busy, self.waited) = (Duration::ZERO, Duration::ZERO);
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("threads", &self.threads()).finish()
    }
}

impl ThreadPool {
    /// A pool of `threads` (at least 1) including the caller.
    pub fn new(threads: usize) -> ThreadPool {
        ThreadPool::build(threads, true)
    }

    /// A pool that never switches its workers off (to test the join protocol alone).
    #[cfg(test)]
    fn always_parallel(threads: usize) -> ThreadPool {
        ThreadPool::build(threads, false)
    }

    fn build(threads: usize, adaptive: bool) -> ThreadPool {
        let shared = Arc::new(Shared {
            ticket: AtomicU64::new(CLOSED),
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
        ThreadPool { shared, workers, dispatch: Mutex::new(Straggle::new(threads, adaptive)) }
    }

    /// Threads that run each job (workers plus the caller).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `job(0)` on the caller and `job(i)` on each worker `i` that joins before the
    /// caller's share is done; returns when every joined worker is done. A job must
    /// therefore claim its work dynamically: any part may fall to the caller (all of it
    /// while a straggle keeps the workers off).
    fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            job(0);
            return;
        }
        let mut straggle = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        if straggle.solo() {
            job(0);
            return;
        }
        let s = &*self.shared;
        // SAFETY: the previous `run` closed its job and waited for every joined worker,
        // and no worker joins a closed ticket, so no one reads `job` now. Erasing the
        // lifetime is sound because the guard below waits for every joined worker before
        // this frame (and `job`'s borrow) ends.
        unsafe {
            let erased: *const Job = std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(job);
            *s.job.get() = Some(erased);
        }
        let generation = (s.ticket.load(Ordering::Relaxed) >> GENERATION_SHIFT).wrapping_add(1) & u64::from(u32::MAX);
        s.ticket.store(generation << GENERATION_SHIFT, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let started = Instant::now();
        let mut waited = Duration::ZERO;
        {
            let _wait = CloseAndWait { shared: s, waited: &mut waited };
            job(0);
        }
        straggle.record(started.elapsed(), waited);
    }

    /// Splits the `[rows, cols]` row-major matrix `out` into tiles of `row_step` rows by
    /// `col_step` columns and calls `task(rows, cols, tile)` once per tile, in parallel.
    /// Tiles are claimed dynamically, so a busy core slows its share, not the whole step.
    pub fn par_tiles<T: Send>(
        &self,
        out: &mut [T],
        cols: usize,
        row_step: usize,
        col_step: usize,
        task: &TileTask<'_, T>,
    ) {
        let col_step = col_step.max(1);
        let span = |i: usize| i * col_step..((i + 1) * col_step).min(cols);
        self.par_grid(out, cols, row_step, cols.div_ceil(col_step), &span, &|rows, i, tile| task(rows, span(i), tile));
    }

    /// Like [`par_tiles`](Self::par_tiles) with explicit column spans: calls
    /// `task(rows, i, tile)` for every tile of `row_step` rows by `spans[i]`. The spans
    /// must be ascending, disjoint and inside `cols`; returns `false` (running nothing)
    /// when they are not.
    pub fn par_spans<T: Send>(
        &self,
        out: &mut [T],
        cols: usize,
        row_step: usize,
        spans: &[Range<usize>],
        task: &SpanTask<'_, T>,
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
    fn par_grid<T: Send>(
        &self,
        out: &mut [T],
        cols: usize,
        row_step: usize,
        n_spans: usize,
        span: &(dyn Fn(usize) -> Range<usize> + Sync),
        task: &SpanTask<'_, T>,
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
            let mut tile =
                Tile { base: base.get(), cols, rows: r.clone(), span: span(i), _out: std::marker::PhantomData };
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
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Closes the current job and waits for the workers inside it, also when the caller's
/// share unwinds; reports how long it waited.
struct CloseAndWait<'a> {
    shared: &'a Shared,
    waited: &'a mut Duration,
}

impl Drop for CloseAndWait<'_> {
    fn drop(&mut self) {
        let s = self.shared;
        s.ticket.fetch_or(CLOSED, Ordering::SeqCst);
        if s.ticket.load(Ordering::Acquire) & JOINED == 0 {
            return;
        }
        let start = Instant::now();
        let mut spins = 0usize;
        while s.ticket.load(Ordering::Acquire) & JOINED != 0 {
            spins += 1;
            if spins < SPIN_ROUNDS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *self.waited = start.elapsed();
    }
}

/// Joins the open job of a generation other than `seen`: `Some(generation)` once joined,
/// `None` if there is none (or it closed first).
fn try_join(s: &Shared, seen: u64) -> Option<u64> {
    let mut t = s.ticket.load(Ordering::Acquire);
    loop {
        let generation = t >> GENERATION_SHIFT;
        if generation == seen || t & CLOSED != 0 {
            return None;
        }
        match s.ticket.compare_exchange_weak(t, t + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(generation),
            Err(now) => t = now,
        }
    }
}

/// Whether a job of a generation other than `seen` is open (or the pool is shutting down).
fn work_waits(s: &Shared, seen: u64) -> bool {
    // SeqCst pairs with `run`'s store and sleeper check, so a parking worker cannot miss
    // a job opened while it parks.
    let t = s.ticket.load(Ordering::SeqCst);
    ((t >> GENERATION_SHIFT) != seen && t & CLOSED == 0) || s.shutdown.load(Ordering::SeqCst)
}

fn worker(s: &Shared, index: usize) {
    // Generation 0 is never used by a job (the first `run` opens generation 1).
    let mut seen = 0;
    loop {
        let mut spins = 0usize;
        while !work_waits(s, seen) && spins < SPIN_ROUNDS {
            std::hint::spin_loop();
            spins += 1;
        }
        if !work_waits(s, seen) {
            let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while !work_waits(s, seen) {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        if s.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let Some(generation) = try_join(s, seen) else { continue };
        seen = generation;
        // SAFETY: the dispatcher wrote `job` before opening this generation, and waits
        // for the joined count (held by this worker until below) to reach 0 before it
        // ends the closure's borrow or writes another job.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // A panicking job must still release the dispatcher.
            // SAFETY: see above; the pointee outlives this call.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job)(index) }));
        }
        s.ticket.fetch_sub(1, Ordering::Release);
    }
}

struct SendPtr<T>(*mut T);

impl<T> SendPtr<T> {
    /// A method, not a field access, so closures capture the `Sync` wrapper.
    fn get(&self) -> *mut T {
        self.0
    }
}
// SAFETY: the pointer is only used to build `Tile`s over disjoint regions (see `Tile`),
// each handed to one thread, so the elements only need to be `Send`.
unsafe impl<T: Send> Sync for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SendPtr<T> {}

/// Exclusive access to one tile (`rows x span`) of the output matrix of `par_tiles`.
pub struct Tile<'a, T = f32> {
    base: *mut T,
    cols: usize,
    rows: Range<usize>,
    span: Range<usize>,
    _out: std::marker::PhantomData<&'a mut [T]>,
}

impl<T> Tile<'_, T> {
    /// The tile's part of output row `row` (which must be in the tile's row range):
    /// `out[row * cols + span]`.
    pub fn row(&mut self, row: usize) -> &mut [T] {
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
    fn the_caller_runs_every_job_and_workers_at_most_once_each() {
        for threads in 1..4 {
            let pool = ThreadPool::new(threads);
            let hits: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
            for job in 1..=100 {
                pool.run(&|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert_eq!(hits[0].load(Ordering::Relaxed), job);
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) <= job));
            }
        }
    }

    #[test]
    fn a_slow_share_is_joined_by_the_workers() {
        // The caller's share waits until another thread has joined: the job ends only
        // because a worker ran it, and `run` waited for that worker.
        let pool = ThreadPool::always_parallel(2);
        let joined = AtomicUsize::new(0);
        for _ in 0..20 {
            joined.store(0, Ordering::SeqCst);
            pool.run(&|i| {
                joined.fetch_add(1, Ordering::SeqCst);
                if i == 0 {
                    while joined.load(Ordering::SeqCst) < 2 {
                        std::thread::yield_now();
                    }
                }
            });
            assert_eq!(joined.load(Ordering::SeqCst), 2);
        }
    }

    #[test]
    fn a_worker_that_holds_up_a_job_is_left_out_for_a_while() {
        let pool = ThreadPool::new(2);
        let spin = |d: Duration| {
            let t = Instant::now();
            while t.elapsed() < d {
                std::hint::spin_loop();
            }
        };
        let helped = AtomicUsize::new(0);
        let job = |i: usize| {
            if i != 0 {
                helped.fetch_add(1, Ordering::SeqCst);
            }
            spin(Duration::from_micros(50));
        };
        // A run of jobs the machine's own load stretched past the solo period proves
        // nothing, so it is tried again (a repeated straggle only lengthens the period).
        let mut checked = false;
        for _ in 0..5 {
            // The worker joins and then stalls well past the caller's share, as one
            // descheduled inside its tile would.
            let joined = AtomicUsize::new(0);
            pool.run(&|i| {
                joined.fetch_add(1, Ordering::SeqCst);
                if i == 0 {
                    while joined.load(Ordering::SeqCst) < 2 {
                        std::thread::yield_now();
                    }
                } else {
                    std::thread::sleep(2 * Straggle::WINDOW);
                }
            });
            helped.store(0, Ordering::SeqCst);
            let started = Instant::now();
            (0..10).for_each(|_| pool.run(&job));
            if started.elapsed() < Straggle::FIRST_SOLO {
                assert_eq!(helped.load(Ordering::SeqCst), 0, "a worker joined while the pool should run alone");
                checked = true;
                break;
            }
        }
        assert!(checked, "every attempt outlasted the solo period");
        // Once the period is over the workers are asked again.
        let deadline = Instant::now() + 3 * Straggle::MAX_SOLO;
        while helped.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            pool.run(&job);
        }
        assert!(helped.load(Ordering::SeqCst) > 0, "the workers never came back");
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
