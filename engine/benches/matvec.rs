//! Matrix-vector (decode) and matrix-matrix (prefill) throughput of the CPU kernels, for
//! each SIMD family this CPU runs.
//!
//! Each decode matrix is ~64 MB, larger than the last-level cache, so the decode figures
//! are DRAM streaming rates (criterion reports GB/s of weights read), comparable with the
//! machine's measured bandwidth (~11.8 GB/s on one thread, ~21.6 GB/s on two).
//! Run: `cargo bench -p crossguard-engine --bench matvec`.

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use engine::backend::cpu::quant::quantize_row;
use engine::backend::cpu::{Activations, Cpu, Format, Kernels, Matrix};

/// Columns of a matrix (the default model's width), rounded up to whole superblocks for
/// the K-quants.
const COLS: usize = 576;

fn cols(format: Format) -> usize {
    COLS.next_multiple_of(format.block_elems())
}
const MATRIX_BYTES: usize = 64 << 20;
const FAMILIES: [Kernels; 2] = [Kernels::Avx512, Kernels::Avx2];

fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32) * 0.37 + seed).sin()).collect()
}

/// `rows` copies of one quantized row (or as many as fill `MATRIX_BYTES` when `None`).
fn matrix(format: Format, rows: Option<usize>) -> Option<Matrix> {
    let row = quantize_row(format, &values(cols(format), 0.5));
    let rows = rows.unwrap_or(MATRIX_BYTES / row.len());
    Matrix::new("bench", format, rows, cols(format), row.repeat(rows))
        .map_err(|e| eprintln!("skipped {format:?}: {e}"))
        .ok()
}

/// `w` times `tokens` activation rows, with each SIMD family this CPU runs, on 1 and 2 threads.
fn every_family(group: &mut BenchmarkGroup<'_, WallTime>, format: Format, w: &Matrix, tokens: usize) {
    let cols = cols(format);
    for kernels in FAMILIES {
        for threads in [1, 2] {
            let Some(cpu) = Cpu::with_kernels(threads, kernels) else { continue };
            let mut a = Activations::default();
            a.set(&values(cols * tokens, 1.0), cols);
            let mut out = vec![0.0; w.rows * tokens];
            let id = BenchmarkId::new(format!("{format:?}/{}", cpu.kernels()), threads);
            group.bench_with_input(id, &threads, |b, _| b.iter(|| cpu.matmul(&[w], &a, &mut out)));
        }
    }
}

fn matvec(c: &mut Criterion) {
    let mut group = c.benchmark_group("matvec");
    group.sample_size(20);
    let formats = [Format::Q4_0, Format::Q4_1, Format::Q5_0, Format::Q5_1, Format::Q8_0, Format::F16];
    let k_quants = [Format::Q2_K, Format::Q3_K, Format::Q4_K, Format::Q5_K, Format::Q6_K];
    for format in formats.into_iter().chain(k_quants) {
        let Some(w) = matrix(format, None) else { continue };
        group.throughput(Throughput::Bytes(w.bytes() as u64));
        every_family(&mut group, format, &w, 1);
    }
    group.finish();
}

fn matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul_64_tokens");
    group.sample_size(10);
    let tokens = 64;
    // A layer-sized matrix (fits in cache): prefill is compute-bound, so report MAC/s.
    // One format per layout the kernels read: nibbles, nibbles with one or two planes of
    // high bits, two sets of scales.
    let rows = 1536;
    for format in [Format::Q4_1, Format::Q4_K, Format::Q5_K, Format::Q3_K, Format::Q6_K] {
        let Some(w) = matrix(format, Some(rows)) else { continue };
        group.throughput(Throughput::Elements((rows * cols(format) * tokens) as u64));
        every_family(&mut group, format, &w, tokens);
    }
    group.finish();
}

criterion_group!(benches, matvec, matmul);
criterion_main!(benches);
