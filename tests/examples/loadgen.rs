//! A small HTTP load generator for the gateway-overhead benchmark
//! (`scripts/bench/gateway_overhead.sh`), and the summariser that turns its output into the
//! tables of `BENCHMARKS.md`.
//!
//! `loadgen run` sends `POST /v1/chat/completions` requests for a fixed time:
//! - closed loop (`--concurrency C`): C workers, each sending its next request as soon as
//!   the previous one has been read to the end;
//! - open loop (`--rate R`): one request started every 1/R s whatever the answers do, so a
//!   slow server cannot slow the offered load down (no coordinated omission). Latency is
//!   counted from the request's actual start; how late starts were against the schedule is
//!   reported apart (`schedule_lag_us`), since the runtime's timer ticks in milliseconds.
//!
//! Latency is from the start of the request to the last byte of the body; for streams,
//! `ttfb_us` is to the first non-empty body chunk (the first SSE `data:` frame). Requests
//! started during `--warmup-s` are sent but not counted. With `--cpu-pid`, the process's
//! CPU time (utime + stime from `/proc/PID/stat`) over the whole run, warm-up included, is
//! divided by every request completed, warm-up included. One JSON line goes to stdout.
//! With `--blocked-ids FILE`, the `x-crossguard-audit-id` of every answer the firewall
//! blocked (`finish_reason` `content_filter` in its body), warm-up included, is appended to
//! FILE one per line: the soak run checks each has exactly one audit record.
//!
//! `loadgen summarize FILE` reads those lines (labelled `scenario`, `target` = `direct`,
//! `crossguard` or a peer gateway such as `litellm`, `rep`) and prints Markdown tables of
//! medians over the repetitions; an "added" figure is the median over repetitions of
//! (gateway − direct) of the same repetition, which were run back to back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use serde_json::{json, Map, Value};

#[derive(Debug, Parser)]
#[command(about = "Load generator for OpenAI-compatible chat completions")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one load test and print one JSON line.
    Run(RunArgs),
    /// Print Markdown tables from a file of `run` lines.
    Summarize { file: std::path::PathBuf },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Full URL of the chat completions route.
    #[arg(long)]
    url: String,
    /// Bearer key (none: no Authorization header).
    #[arg(long)]
    key: Option<String>,
    /// `model` in the request.
    #[arg(long, default_value = "mock")]
    model: String,
    /// Ask for a streamed answer.
    #[arg(long)]
    stream: bool,
    /// Closed loop with this many workers (ignored with --rate).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Open loop at this many requests per second.
    #[arg(long)]
    rate: Option<f64>,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 5.0)]
    duration_s: f64,
    /// Seconds of load sent first and not counted.
    #[arg(long, default_value_t = 1.0)]
    warmup_s: f64,
    /// Runtime worker threads (1: a current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// A process whose CPU time per request to report (the server under test).
    #[arg(long)]
    cpu_pid: Option<u32>,
    /// `key=value` pairs copied into the output's `labels`.
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Append the audit id of every blocked answer to this file.
    #[arg(long)]
    blocked_ids: Option<std::path::PathBuf>,
}

/// Open loop: more requests in flight than this and new ones are skipped (and counted).
const MAX_IN_FLIGHT: usize = 4096;
/// Longest any one request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One finished request; times in microseconds.
#[derive(Debug, Clone)]
struct Sample {
    /// Started after the warm-up and before the end: counted.
    counted: bool,
    ok: bool,
    latency_us: u64,
    ttfb_us: Option<u64>,
    /// Open loop: actual start minus scheduled start.
    lag_us: Option<u64>,
    /// The answer was blocked by the firewall: its audit id (when the header came).
    blocked: Option<String>,
}

/// What reading an answer found.
#[derive(Debug, Default)]
struct Read {
    /// 2xx and complete.
    ok: bool,
    ttfb_us: Option<u64>,
    /// `finish_reason: content_filter` somewhere in the body.
    blocked: bool,
}

/// What every request shares.
struct Target {
    client: reqwest::Client,
    url: String,
    auth: Option<String>,
    body: Bytes,
    /// Counted window: [measure_from, measure_until).
    measure_from: Instant,
    measure_until: Instant,
}

impl Target {
    fn build(args: &RunArgs, started: Instant) -> Result<Target, String> {
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(MAX_IN_FLIGHT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot build HTTP client: {e}"))?;
        let body = json!({
            "model": args.model,
            "messages": [{"role": "user", "content": "Say hello in one short sentence, please."}],
            "max_tokens": 32,
            "stream": args.stream,
        });
        let measure_from = started + secs(args.warmup_s)?;
        Ok(Target {
            client,
            url: args.url.clone(),
            auth: args.key.as_ref().map(|k| format!("Bearer {k}")),
            body: Bytes::from(body.to_string()),
            measure_from,
            measure_until: measure_from + secs(args.duration_s)?,
        })
    }

    /// Sends one request and reads its answer to the end.
    async fn one(&self, lag_us: Option<u64>) -> Sample {
        let t0 = Instant::now();
        let counted = t0 >= self.measure_from && t0 < self.measure_until;
        let mut request = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(self.body.clone());
        if let Some(auth) = &self.auth {
            request = request.header(reqwest::header::AUTHORIZATION, auth);
        }
        let (read, audit_id) = match request.send().await {
            Ok(response) => {
                let audit_id = response.headers().get(AUDIT_ID_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
                (read_to_end(response, t0).await, audit_id)
            }
            Err(_) => (Read::default(), None),
        };
        let blocked = read.blocked.then(|| audit_id.unwrap_or_default());
        Sample { counted, ok: read.ok, latency_us: micros(t0.elapsed()), ttfb_us: read.ttfb_us, lag_us, blocked }
    }
}

const AUDIT_ID_HEADER: &str = "x-crossguard-audit-id";
const BLOCKED_MARK: &[u8] = b"\"content_filter\"";

/// Reads a body to its end. A streamed body is complete only when it ends with
/// `data: [DONE]`.
async fn read_to_end(mut response: reqwest::Response, t0: Instant) -> Read {
    let status_ok = response.status().is_success();
    let is_sse = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut read = Read::default();
    // tail: the body's last <= 32 bytes, to see whether it ended with [DONE], and to find
    // the blocked mark when a chunk boundary splits it.
    let mut tail: Vec<u8> = Vec::with_capacity(64);
    loop {
        match response.chunk().await {
            Ok(Some(piece)) if !piece.is_empty() => {
                read.ttfb_us.get_or_insert_with(|| micros(t0.elapsed()));
                let head = &piece[..piece.len().min(BLOCKED_MARK.len())];
                read.blocked |=
                    contains(&piece, BLOCKED_MARK) || contains(&[tail.as_slice(), head].concat(), BLOCKED_MARK);
                tail.extend_from_slice(&piece[piece.len().saturating_sub(32)..]);
                let excess = tail.len().saturating_sub(32);
                tail.drain(..excess);
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => return read,
        }
    }
    let complete = !is_sse || tail.ends_with(b"data: [DONE]\n\n");
    read.ok = status_ok && complete;
    read
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn secs(s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s).map_err(|e| format!("bad duration {s}: {e}"))
}

/// Closed loop: `concurrency` workers until the end of the counted window.
async fn closed_loop(target: Arc<Target>, concurrency: usize) -> (Vec<Sample>, u64) {
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let target = target.clone();
            tokio::spawn(async move {
                let mut samples = Vec::new();
                while Instant::now() < target.measure_until {
                    samples.push(target.one(None).await);
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for w in workers {
        if let Ok(mut s) = w.await {
            samples.append(&mut s);
        }
    }
    (samples, 0)
}

/// Open loop: one request every 1/rate s until the end of the counted window; returns the
/// samples and how many scheduled requests were skipped for too many in flight.
async fn open_loop(target: Arc<Target>, rate: f64) -> Result<(Vec<Sample>, u64), String> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(format!("--rate must be positive, got {rate}"));
    }
    let mut ticker = tokio::time::interval(secs(1.0 / rate)?);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Sample>();
    let mut skipped = 0u64;
    loop {
        let scheduled = ticker.tick().await.into_std();
        if scheduled >= target.measure_until {
            break;
        }
        if in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            skipped += 1;
            continue;
        }
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (target, tx, in_flight) = (target.clone(), tx.clone(), in_flight.clone());
        tokio::spawn(async move {
            let lag = micros(Instant::now().saturating_duration_since(scheduled));
            let _ = tx.send(target.one(Some(lag)).await);
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
    drop(tx);
    let mut samples = Vec::new();
    while let Some(s) = rx.recv().await {
        samples.push(s);
    }
    Ok((samples, skipped))
}

/// utime + stime of a process, in microseconds.
fn cpu_time_us(pid: u32) -> Result<u64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    // The command name (field 2) may hold spaces; fields after its ')' are space-separated,
    // utime and stime being fields 14 and 15 of the whole line (12 and 13 after the name).
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    match (tick(11), tick(12)) {
        (Some(u), Some(s)) => Ok((u + s) * 1_000_000 / clock_ticks_per_second()),
        _ => Err(format!("/proc/{pid}/stat: unexpected format")),
    }
}

/// `getconf CLK_TCK`; 100 on every Linux this runs on, asked anyway.
fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t: &u64| t > 0)
        .unwrap_or(100)
}

/// p50 / p90 / p99 / max / mean of some microsecond figures (nearest rank), or null.
fn percentiles(mut values: Vec<u64>) -> Value {
    if values.is_empty() {
        return Value::Null;
    }
    values.sort_unstable();
    let rank = |p: f64| values[((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
    let mean = values.iter().sum::<u64>() as f64 / values.len() as f64;
    json!({"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": rank(1.0), "mean": mean.round()})
}

/// Appends the audit ids of blocked answers to `path` (an id missing from a blocked answer
/// is written as an empty line: the soak check counts it as a record that cannot exist).
fn write_blocked_ids(path: &std::path::Path, samples: &[Sample]) -> Result<(), String> {
    use std::io::Write;
    let lines: String = samples.iter().filter_map(|s| s.blocked.as_deref()).map(|id| format!("{id}\n")).collect();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(lines.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn labels(pairs: &[String]) -> Result<Map<String, Value>, String> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) => Ok((k.to_owned(), Value::String(v.to_owned()))),
            None => Err(format!("--label wants key=value, got {p:?}")),
        })
        .collect()
}

async fn run(args: RunArgs) -> Result<Value, String> {
    let labels = labels(&args.labels)?;
    let cpu_before = args.cpu_pid.map(cpu_time_us).transpose()?;
    let started = Instant::now();
    let target = Arc::new(Target::build(&args, started)?);
    let (samples, skipped) = match args.rate {
        Some(rate) => open_loop(target.clone(), rate).await?,
        None => closed_loop(target.clone(), args.concurrency).await,
    };
    let cpu_us_per_req = match (args.cpu_pid, cpu_before) {
        (Some(pid), Some(before)) => {
            let used = cpu_time_us(pid)?.saturating_sub(before);
            Some((used as f64 / samples.len().max(1) as f64).round())
        }
        _ => None,
    };
    if let Some(path) = &args.blocked_ids {
        write_blocked_ids(path, &samples)?;
    }
    let counted: Vec<&Sample> = samples.iter().filter(|s| s.counted).collect();
    let good: Vec<&Sample> = counted.iter().copied().filter(|s| s.ok).collect();
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    Ok(json!({
        "labels": labels,
        "mode": if args.rate.is_some() { "open" } else { "closed" },
        "concurrency": args.rate.is_none().then_some(args.concurrency),
        "rate": args.rate,
        "stream": args.stream,
        "duration_s": args.duration_s,
        "requests": good.len(),
        "blocked": counted.iter().filter(|s| s.blocked.is_some()).count(),
        "errors": counted.len() - good.len(),
        "skipped": skipped,
        "rps": (good.len() as f64 / args.duration_s * 10.0).round() / 10.0,
        "latency_us": percentiles(good.iter().map(|s| s.latency_us).collect()),
        "ttfb_us": if args.stream { percentiles(good.iter().filter_map(|s| s.ttfb_us).collect()) } else { Value::Null },
        "schedule_lag_us": percentiles(counted.iter().filter_map(|s| s.lag_us).collect()),
        "cpu_us_per_req": cpu_us_per_req,
        "loadavg_1m": loadavg.split_whitespace().next().and_then(|l| l.parse::<f64>().ok()),
    }))
}

// ---------------------------------------------------------------------------------------
// summarize

/// One scenario's runs: target -> rep -> the run's JSON line.
type Runs = BTreeMap<String, BTreeMap<String, Value>>;

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 })
}

/// A figure from a run line by JSON pointer (`/latency_us/p99`).
fn figure(run: &Value, pointer: &str) -> Option<f64> {
    run.pointer(pointer).and_then(Value::as_f64)
}

/// Median over repetitions of one target's figure.
fn med(runs: &Runs, target: &str, pointer: &str) -> Option<f64> {
    median(runs.get(target)?.values().filter_map(|r| figure(r, pointer)).collect())
}

/// Median over repetitions of (crossguard − direct), pairing runs by `rep`.
fn added(runs: &Runs, pointer: &str) -> Option<f64> {
    added_by(runs, "crossguard", pointer)
}

/// Median over repetitions of (`target` − direct), pairing runs by `rep`.
fn added_by(runs: &Runs, target: &str, pointer: &str) -> Option<f64> {
    let (direct, through) = (runs.get("direct")?, runs.get(target)?);
    let diffs =
        through.iter().filter_map(|(rep, t)| Some(figure(t, pointer)? - figure(direct.get(rep)?, pointer)?)).collect();
    median(diffs)
}

/// Microseconds as milliseconds with three decimals; "–" when missing.
fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |us| format!("{:.3}", us / 1000.0))
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |x| format!("{x:.0}"))
}

/// Errors and skipped requests over all runs of a scenario (should be 0).
fn failures(runs: &Runs) -> u64 {
    let sum = |k: &str| runs.values().flat_map(|m| m.values()).filter_map(|r| r[k].as_u64()).sum::<u64>();
    sum("errors") + sum("skipped")
}

fn closed_row(name: &str, runs: &Runs) -> String {
    let (l50, l99, rps) = ("/latency_us/p50", "/latency_us/p99", "/rps");
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        ms(med(runs, "direct", l50)),
        ms(med(runs, "direct", l99)),
        num(med(runs, "direct", rps)),
        ms(med(runs, "crossguard", l50)),
        ms(med(runs, "crossguard", l99)),
        num(med(runs, "crossguard", rps)),
        ms(added(runs, l50)),
        ms(added(runs, l99)),
        num(med(runs, "direct", "/cpu_us_per_req")),
        num(med(runs, "crossguard", "/cpu_us_per_req")),
        failures(runs),
    )
}

fn stream_row(name: &str, runs: &Runs) -> String {
    let (t50, t99, e50, e99) = ("/ttfb_us/p50", "/ttfb_us/p99", "/latency_us/p50", "/latency_us/p99");
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        ms(med(runs, "direct", t50)),
        ms(med(runs, "direct", t99)),
        ms(med(runs, "crossguard", t50)),
        ms(med(runs, "crossguard", t99)),
        ms(added(runs, t50)),
        ms(added(runs, t99)),
        ms(med(runs, "direct", e50)),
        ms(med(runs, "crossguard", e50)),
        ms(added(runs, e99)),
        num(med(runs, "direct", "/cpu_us_per_req")),
        num(med(runs, "crossguard", "/cpu_us_per_req")),
        failures(runs),
    )
}

/// crossguard against a peer gateway (`target` = `litellm`) on the same mock, same run.
fn peer_row(name: &str, runs: &Runs, peer: &str) -> String {
    let (l50, l99, rps, t50, cpu) = ("/latency_us/p50", "/latency_us/p99", "/rps", "/ttfb_us/p50", "/cpu_us_per_req");
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.1}×", a / b),
        _ => "–".to_owned(),
    };
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        ms(added_by(runs, "crossguard", l50)),
        ms(added_by(runs, peer, l50)),
        ms(added_by(runs, peer, l99)),
        ms(med(runs, peer, t50)),
        num(med(runs, "crossguard", rps)),
        num(med(runs, peer, rps)),
        ratio(med(runs, "crossguard", rps), med(runs, peer, rps)),
        num(med(runs, "crossguard", cpu)),
        num(med(runs, peer, cpu)),
        ratio(med(runs, peer, cpu), med(runs, "crossguard", cpu)),
    )
}

/// Reads the run lines into scenario -> runs, keeping the scenarios' first-seen order.
fn read_runs(text: &str) -> Result<Vec<(String, Runs)>, String> {
    let mut scenarios: Vec<(String, Runs)> = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let run: Value = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        let label = |k: &str| run["labels"][k].as_str().unwrap_or("").to_owned();
        let (scenario, target, rep) = (label("scenario"), label("target"), label("rep"));
        let pos = match scenarios.iter().position(|(s, _)| *s == scenario) {
            Some(p) => p,
            None => {
                scenarios.push((scenario, Runs::new()));
                scenarios.len() - 1
            }
        };
        scenarios[pos].1.entry(target).or_default().insert(rep, run);
    }
    Ok(scenarios)
}

fn summarize(text: &str) -> Result<String, String> {
    let scenarios = read_runs(text)?;
    let first = |runs: &Runs| runs.values().flat_map(|m| m.values()).next().cloned().unwrap_or(Value::Null);
    let mut closed = vec![
        "| non-streaming | direct p50 | direct p99 | direct req/s | crossguard p50 | crossguard p99 | crossguard req/s | added p50 | added p99 | mock CPU µs/req | gateway CPU µs/req | errors |".to_owned(),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|".to_owned(),
    ];
    let mut stream = vec![
        "| streaming | direct TTFB p50 | direct TTFB p99 | crossguard TTFB p50 | crossguard TTFB p99 | added TTFB p50 | added TTFB p99 | direct end p50 | crossguard end p50 | added end p99 | mock CPU µs/req | gateway CPU µs/req | errors |".to_owned(),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|".to_owned(),
    ];
    let peer = scenarios
        .iter()
        .flat_map(|(_, runs)| runs.keys())
        .find(|t| !matches!(t.as_str(), "direct" | "crossguard"))
        .cloned();
    let mut peers = match &peer {
        Some(p) => vec![
            format!("| vs {p} | crossguard added p50 | {p} added p50 | {p} added p99 | {p} TTFB p50 | crossguard req/s | {p} req/s | req/s ratio | crossguard CPU µs/req | {p} CPU µs/req | CPU ratio |"),
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|".to_owned(),
        ],
        None => Vec::new(),
    };
    let mut loads = Vec::new();
    for (name, runs) in &scenarios {
        let head = first(runs);
        let label = match (head["rate"].as_f64(), head["concurrency"].as_u64()) {
            (Some(r), _) => format!("{name}: open loop {r:.0} req/s"),
            (None, c) => format!("{name}: closed loop, concurrency {}", c.unwrap_or(1)),
        };
        if head["stream"].as_bool().unwrap_or(false) {
            stream.push(stream_row(&label, runs));
        } else {
            closed.push(closed_row(&label, runs));
        }
        if let Some(p) = peer.as_ref().filter(|p| runs.contains_key(*p)) {
            peers.push(peer_row(&label, runs, p));
        }
        loads.extend(runs.values().flat_map(|m| m.values()).filter_map(|r| r["loadavg_1m"].as_f64()));
    }
    let load_range = match (loads.iter().copied().reduce(f64::min), loads.iter().copied().reduce(f64::max)) {
        (Some(lo), Some(hi)) => format!("1-minute load average during the runs: {lo:.2} – {hi:.2}"),
        _ => "load average: not recorded".to_owned(),
    };
    Ok(format!(
        "Latencies in ms (medians over repetitions); added = median of per-repetition (crossguard − direct).\n\n{}\n\n{}\n\n{}{load_range}\n",
        closed.join("\n"),
        stream.join("\n"),
        if peers.is_empty() { String::new() } else { format!("{}\n\n", peers.join("\n")) }
    ))
}

fn main() -> std::process::ExitCode {
    let outcome = match Cli::parse().command {
        Command::Summarize { file } => std::fs::read_to_string(&file)
            .map_err(|e| format!("{}: {e}", file.display()))
            .and_then(|text| summarize(&text))
            .map(|table| print!("{table}")),
        Command::Run(args) => {
            let runtime = if args.threads <= 1 {
                tokio::runtime::Builder::new_current_thread().enable_all().build()
            } else {
                tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads).enable_all().build()
            };
            runtime
                .map_err(|e| format!("cannot start the runtime: {e}"))
                .and_then(|rt| rt.block_on(run(args)))
                .map(|line| println!("{line}"))
        }
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let p = percentiles((1..=100).collect());
        assert_eq!((p["p50"].as_u64(), p["p99"].as_u64(), p["max"].as_u64()), (Some(50), Some(99), Some(100)));
        assert_eq!(percentiles(Vec::new()), Value::Null);
    }

    #[test]
    fn added_pairs_repetitions() {
        let line = |target: &str, rep: &str, p50: u64| {
            json!({"labels": {"scenario": "c1", "target": target, "rep": rep}, "rate": null, "concurrency": 1,
                   "stream": false, "latency_us": {"p50": p50, "p99": p50}, "rps": 1.0, "errors": 0, "skipped": 0})
            .to_string()
        };
        let text = [
            line("direct", "1", 100),
            line("crossguard", "1", 300),
            line("direct", "2", 1000),
            line("crossguard", "2", 1100),
            line("direct", "3", 50),
            line("crossguard", "3", 200),
        ]
        .join("\n");
        let scenarios = read_runs(&text).unwrap();
        assert_eq!(added(&scenarios[0].1, "/latency_us/p50"), Some(150.0));
        assert!(summarize(&text).unwrap().contains("| 0.150 |"));
    }
}
