//! Matrix-vector (decode) and matrix-matrix (prefill) throughput of the CPU kernels.
//!
//! Each weight matrix is ~64 MB, larger than the last-level cache, so the decode figures
//! are DRAM streaming rates (criterion reports GB/s of weights read), comparable with the
//! machine's measured bandwidth (~11.8 GB/s on one thread, ~21.6 GB/s on two).
//! Run: `cargo bench -p crossguard-engine --bench matvec`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::backend::cpu::quant::quantize_row;
use engine::backend::cpu::{Activations, Cpu, Format, Matrix};

const COLS: usize = 576;
const MATRIX_BYTES: usize = 64 << 20;

fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32) * 0.37 + seed).sin()).collect()
}

fn matrix(format: Format) -> Matrix {
    let row = quantize_row(format, &values(COLS, 0.5));
    let rows = MATRIX_BYTES / row.len();
    let data: Vec<u8> = row.iter().copied().cycle().take(rows * row.len()).collect();
    Matrix::new("bench", format, rows, COLS, data).unwrap_or_else(|e| panic!("{e}"))
}

fn matvec(c: &mut Criterion) {
    let mut group = c.benchmark_group("matvec");
    group.sample_size(20);
    for format in [Format::Q4_0, Format::Q4_1, Format::Q5_0, Format::Q5_1, Format::Q8_0, Format::F16] {
        let w = matrix(format);
        group.throughput(Throughput::Bytes(w.bytes() as u64));
        for threads in [1, 2] {
            let cpu = Cpu::new(threads);
            let mut a = Activations::default();
            a.set(&values(COLS, 1.0), COLS);
            let mut out = vec![0.0; w.rows];
            group.bench_with_input(BenchmarkId::new(format!("{format:?}"), threads), &threads, |b, _| {
                b.iter(|| cpu.matmul(&[&w], &a, &mut out))
            });
        }
    }
    group.finish();
}

fn matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul_64_tokens");
    group.sample_size(10);
    let tokens = 64;
    // A layer-sized matrix (fits in cache): prefill is compute-bound, so report MAC/s.
    let row = quantize_row(Format::Q4_1, &values(COLS, 0.5));
    let rows = 1536;
    let w = Matrix::new("ffn", Format::Q4_1, rows, COLS, row.repeat(rows)).unwrap_or_else(|e| panic!("{e}"));
    group.throughput(Throughput::Elements((rows * COLS * tokens) as u64));
    for threads in [1, 2] {
        let cpu = Cpu::new(threads);
        let mut a = Activations::default();
        a.set(&values(COLS * tokens, 1.0), COLS);
        let mut out = vec![0.0; rows * tokens];
        group.bench_with_input(BenchmarkId::new("Q4_1", threads), &threads, |b, _| b.iter(|| cpu.matmul(&[&w], &a, &mut out)));
    }
    group.finish();
}

criterion_group!(benches, matvec, matmul);
criterion_main!(benches);
