//! ggml's K-quant superblocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): their byte layouts, exact
//! decoding, and a plain encoder.
//!
//! Owns: where each bit of a 256-element superblock lives. Everything else reads a
//! superblock through [`SuperBlock`]: 256 small integer levels and, per 16 elements, a
//! scale and a minimum, so that element `e` is `scale[e / 16] * q[e] - min[e / 16]`. The
//! formats with 32-element sub-blocks (Q4_K, Q5_K) repeat each sub-block's pair for its two
//! halves. Scales are computed as ggml computes them (`f16 d * 6-bit scale` in f32), so
//! [`dequantize`] equals the reference bit for bit (`kquant_dequantization_matches_gguf`
//! checks it against the `gguf` Python package on random superblocks).
//!
//! The encoder ([`quantize`]) is a simple one (each sub-block's own range, then the
//! superblock's scales rounded to their bit widths), for tests and benches: llama.cpp's
//! quantizer searches for better scales, which only changes which valid bytes come out.

use half::f16;

use super::quant::Format;

/// Elements per superblock (ggml's QK_K).
pub const QK_K: usize = 256;

/// Elements per sub-block scale.
const SUB: usize = 16;

/// One superblock decoded: element `e` is `scale[e / 16] * q[e] - min[e / 16]`.
#[derive(Clone, Debug, PartialEq)]
pub struct SuperBlock {
    /// Q2_K 0..=3, Q3_K -4..=3, Q4_K 0..=15, Q5_K 0..=31, Q6_K -32..=31.
    pub q: [i8; QK_K],
    pub scale: [f32; QK_K / SUB],
    pub min: [f32; QK_K / SUB],
}

impl Default for SuperBlock {
    fn default() -> SuperBlock {
        SuperBlock { q: [0; QK_K], scale: [0.0; QK_K / SUB], min: [0.0; QK_K / SUB] }
    }
}

/// Whether `format` is a K-quant.
pub fn is_k(format: Format) -> bool {
    matches!(format, Format::Q2_K | Format::Q3_K | Format::Q4_K | Format::Q5_K | Format::Q6_K)
}

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) of Q4_K and Q5_K's 12 packed bytes:
/// bytes 0..4 hold scales 0..4 (low 6 bits), 4..8 minimums 0..4, 8..12 the low nibbles of
/// scales and minimums 4..8, whose top two bits are the top bits of bytes 0..8.
fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// [`scale_min_k4`]'s inverse: 8 scales and 8 minimums (each < 64) into 12 bytes.
fn pack_scale_min_k4(sc: &[u8], m: &[u8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
    }
    s
}

/// The signed 6-bit scale `i` (0..16) of Q3_K's 12 packed bytes: low nibbles in bytes
/// 0..8 (scales 0..8 low, 8..16 high), top two bits in bytes 8..12.
fn scale_k3(s: &[u8], i: usize) -> i32 {
    let low = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
    let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// The 2-bit field of element `e` of a Q2_K/Q3_K block's 64 bytes `qs`: element
/// `128h + 32k + l` sits in bits `2k..2k+2` of byte `32h + l`.
#[inline]
fn crumb(qs: &[u8], e: usize) -> i8 {
    let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
    ((qs[32 * h + l] >> (2 * k)) & 3) as i8
}

/// Decodes one superblock (`b` is exactly `format.block_bytes()` bytes of a K-quant).
pub fn decode(format: Format, b: &[u8]) -> SuperBlock {
    let mut out = SuperBlock::default();
    match format {
        Format::Q2_K => {
            let (scales, qs) = (&b[..16], &b[16..80]);
            let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
            for (e, q) in out.q.iter_mut().enumerate() {
                *q = crumb(qs, e);
            }
            for (i, s) in scales.iter().enumerate() {
                out.scale[i] = d * f32::from(s & 0x0f);
                out.min[i] = dmin * f32::from(s >> 4);
            }
        }
        Format::Q3_K => {
            let (hmask, qs, scales) = (&b[..32], &b[32..96], &b[96..108]);
            let d = f16_at(b, 108);
            for (e, q) in out.q.iter_mut().enumerate() {
                // A clear high bit means the level is 4 lower.
                let high = (hmask[e % 32] >> (e / 32)) & 1;
                *q = crumb(qs, e) - if high == 0 { 4 } else { 0 };
            }
            for (i, s) in out.scale.iter_mut().enumerate() {
                *s = d * scale_k3(scales, i) as f32;
            }
        }
        Format::Q4_K | Format::Q5_K => {
            let (d, dmin, scales) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
            let (qh, qs) = if format == Format::Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for (e, q) in out.q.iter_mut().enumerate() {
                // Sub-block j = 2c + s: low (s = 0) or high nibbles of bytes 32c..32c + 32.
                let (j, l) = (e / 32, e % 32);
                let low = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
                let high = qh.map_or(0, |qh| ((qh[l] >> j) & 1) << 4);
                *q = (low | high) as i8;
            }
            for j in 0..8 {
                let (sc, m) = scale_min_k4(scales, j);
                let (scale, min) = (d * f32::from(sc), dmin * f32::from(m));
                out.scale[2 * j..2 * j + 2].fill(scale);
                out.min[2 * j..2 * j + 2].fill(min);
            }
        }
        Format::Q6_K => {
            let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
            let d = f16_at(b, 208);
            for (e, q) in out.q.iter_mut().enumerate() {
                // Element 128h + 32k + l: a nibble of byte 64h + 32(k % 2) + l (low for
                // k < 2) and bits 2k..2k+2 of byte 32h + l above it.
                let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
                let low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0f;
                let high = (qh[32 * h + l] >> (2 * k)) & 3;
                *q = (low | (high << 4)) as i8 - 32;
            }
            for (s, raw) in out.scale.iter_mut().zip(scales) {
                *s = d * f32::from(*raw as i8);
            }
        }
        _ => {}
    }
    out
}

/// Dequantizes whole superblocks of `format` from `row` into `out` (256 values each).
pub fn dequantize(format: Format, row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(QK_K)) {
        let sb = decode(format, b);
        for (e, v) in o.iter_mut().enumerate() {
            *v = sb.scale[e / SUB] * f32::from(sb.q[e]) - sb.min[e / SUB];
        }
    }
}

/// Encodes 256 values as one superblock of `format` (appended to `out`): each 16- or
/// 32-element sub-block's range, then the superblock's scale of those ranges.
pub fn quantize(format: Format, x: &[f32], out: &mut Vec<u8>) {
    let range = |c: &[f32]| (c.iter().fold(0.0f32, |m, v| m.min(*v)), c.iter().fold(0.0f32, |m, v| m.max(*v)));
    // The signed value of largest magnitude (the symmetric formats map it to the lowest level).
    let smax = |c: &[f32]| c.iter().fold(0.0f32, |m, v| if v.abs() > m.abs() { *v } else { m });
    let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
    let push_f16 = |out: &mut Vec<u8>, v: f32| out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
    match format {
        Format::Q4_K | Format::Q5_K => {
            let top = if format == Format::Q4_K { 15.0 } else { 31.0 };
            let subs: Vec<(f32, f32)> = x.chunks_exact(32).map(range).map(|(lo, hi)| ((hi - lo) / top, -lo)).collect();
            let d = round_f16(subs.iter().fold(0.0f32, |m, s| m.max(s.0)) / 63.0);
            let dmin = round_f16(subs.iter().fold(0.0f32, |m, s| m.max(s.1)) / 63.0);
            let sc: Vec<u8> = subs.iter().map(|s| (s.0 * inv(d)).round().clamp(0.0, 63.0) as u8).collect();
            let m: Vec<u8> = subs.iter().map(|s| (s.1 * inv(dmin)).round().clamp(0.0, 63.0) as u8).collect();
            let q: Vec<u8> = x
                .iter()
                .enumerate()
                .map(|(e, v)| {
                    ((v + dmin * f32::from(m[e / 32])) * inv(d * f32::from(sc[e / 32]))).round().clamp(0.0, top) as u8
                })
                .collect();
            push_f16(out, d);
            push_f16(out, dmin);
            out.extend_from_slice(&pack_scale_min_k4(&sc, &m));
            if format == Format::Q5_K {
                out.extend((0..32).map(|l| (0..8).fold(0u8, |h, j| h | (((q[32 * j + l] >> 4) & 1) << j))));
            }
            out.extend((0..128).map(|i| {
                let (c, l) = (i / 32, i % 32);
                (q[64 * c + l] & 0x0f) | ((q[64 * c + 32 + l] & 0x0f) << 4)
            }));
        }
        Format::Q6_K => {
            let subs: Vec<f32> = x.chunks_exact(SUB).map(|c| smax(c) / -32.0).collect();
            let d = round_f16(subs.iter().fold(0.0f32, |m, s| if s.abs() > m.abs() { *s } else { m }) / -127.0);
            let sc: Vec<i8> = subs.iter().map(|s| (s * inv(d)).round().clamp(-127.0, 127.0) as i8).collect();
            let q: Vec<u8> = x
                .iter()
                .enumerate()
                .map(|(e, v)| ((v * inv(d * f32::from(sc[e / SUB]))).round().clamp(-32.0, 31.0) + 32.0) as u8)
                .collect();
            let mut ql = [0u8; 128];
            let mut qh = [0u8; 64];
            for (e, v) in q.iter().enumerate() {
                let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
                ql[64 * h + 32 * (k % 2) + l] |= (v & 0x0f) << (4 * (k / 2));
                qh[32 * h + l] |= (v >> 4) << (2 * k);
            }
            out.extend_from_slice(&ql);
            out.extend_from_slice(&qh);
            out.extend(sc.iter().map(|s| *s as u8));
            push_f16(out, d);
        }
        Format::Q3_K => {
            let subs: Vec<f32> = x.chunks_exact(SUB).map(|c| smax(c) / -4.0).collect();
            let d = round_f16(subs.iter().fold(0.0f32, |m, s| if s.abs() > m.abs() { *s } else { m }) / -32.0);
            let sc: Vec<i32> = subs.iter().map(|s| (s * inv(d)).round().clamp(-32.0, 31.0) as i32).collect();
            let q: Vec<i32> = x
                .iter()
                .enumerate()
                .map(|(e, v)| (v * inv(d * sc[e / SUB] as f32)).round().clamp(-4.0, 3.0) as i32)
                .collect();
            let mut hmask = [0u8; 32];
            let mut qs = [0u8; 64];
            for (e, v) in q.iter().enumerate() {
                // Levels 0..=3 set the high bit; -4..=-1 store level + 4 with it clear.
                let low = if *v >= 0 {
                    hmask[e % 32] |= 1 << (e / 32);
                    *v
                } else {
                    v + 4
                };
                let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
                qs[32 * h + l] |= (low as u8) << (2 * k);
            }
            let mut scales = [0u8; 12];
            for (i, s) in sc.iter().enumerate() {
                let u = (s + 32) as u8;
                scales[i % 8] |= (u & 0x0f) << (4 * (i / 8));
                scales[8 + i % 4] |= (u >> 4) << (2 * (i / 4));
            }
            out.extend_from_slice(&hmask);
            out.extend_from_slice(&qs);
            out.extend_from_slice(&scales);
            push_f16(out, d);
        }
        Format::Q2_K => {
            let subs: Vec<(f32, f32)> = x.chunks_exact(SUB).map(range).map(|(lo, hi)| ((hi - lo) / 3.0, -lo)).collect();
            let d = round_f16(subs.iter().fold(0.0f32, |m, s| m.max(s.0)) / 15.0);
            let dmin = round_f16(subs.iter().fold(0.0f32, |m, s| m.max(s.1)) / 15.0);
            let sc: Vec<u8> = subs.iter().map(|s| (s.0 * inv(d)).round().clamp(0.0, 15.0) as u8).collect();
            let m: Vec<u8> = subs.iter().map(|s| (s.1 * inv(dmin)).round().clamp(0.0, 15.0) as u8).collect();
            out.extend(sc.iter().zip(&m).map(|(s, m)| s | (m << 4)));
            let mut qs = [0u8; 64];
            for (e, v) in x.iter().enumerate() {
                let i = e / SUB;
                let q = ((v + dmin * f32::from(m[i])) * inv(d * f32::from(sc[i]))).round().clamp(0.0, 3.0) as u8;
                let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
                qs[32 * h + l] |= q << (2 * k);
            }
            out.extend_from_slice(&qs);
            push_f16(out, d);
            push_f16(out, dmin);
        }
        _ => {}
    }
}

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::super::quant::tests::wave;
    use super::*;

    pub(crate) const K_QUANTS: [Format; 5] = [Format::Q2_K, Format::Q3_K, Format::Q4_K, Format::Q5_K, Format::Q6_K];

    /// Random superblocks and the `gguf` package's dequantization of them
    /// (`scripts/fixtures/make_kquant_fixtures.py`).
    const GGUF_FIXTURE: &str = include_str!("../../../tests/fixtures/kquant_dequant.json");

    #[test]
    fn kquant_dequantization_matches_gguf() -> Result<(), Box<dyn std::error::Error>> {
        let fixture: serde_json::Value = serde_json::from_str(GGUF_FIXTURE)?;
        let cases = fixture["formats"].as_array().ok_or("formats")?;
        let mut seen = Vec::new();
        for case in cases {
            let name = case["type"].as_str().ok_or("type")?;
            let format = [K_QUANTS.as_slice(), &[Format::BF16]]
                .concat()
                .into_iter()
                .find(|f| format!("{f:?}") == name)
                .ok_or(name.to_owned())?;
            let bytes = hex::decode(case["bytes"].as_str().ok_or("bytes")?)?;
            let want: Vec<f32> = case["values"]
                .as_array()
                .ok_or("values")?
                .iter()
                .map(|v| v.as_f64().map(|v| v as f32).unwrap_or(f32::NAN))
                .collect();
            let mut got = vec![f32::NAN; want.len()];
            super::super::quant::dequantize_row(format, &bytes, &mut got);
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(w.to_bits(), g.to_bits(), "{name} element {i}: gguf {w}, ours {g}");
            }
            seen.push(format);
        }
        for f in K_QUANTS.iter().chain(&[Format::BF16]) {
            assert!(seen.contains(f), "{f:?} missing from the fixture");
        }
        Ok(())
    }

    #[test]
    fn encoding_round_trips_within_a_step_of_each_sub_block() {
        for format in K_QUANTS {
            for seed in [0.0f32, 1.3, -2.1] {
                let x: Vec<f32> =
                    wave(2 * QK_K, seed).iter().enumerate().map(|(i, v)| v * (1.0 + (i / 16) as f32 * 0.2)).collect();
                let mut bytes = Vec::new();
                for c in x.chunks_exact(QK_K) {
                    quantize(format, c, &mut bytes);
                }
                assert_eq!(Some(bytes.len()), format.row_bytes(x.len()), "{format:?}");
                let mut back = vec![0.0; x.len()];
                dequantize(format, &bytes, &mut back);
                // Levels per sub-block, and the share of a sub-block's range the rounded
                // superblock scales can add to a step.
                let levels = match format {
                    Format::Q2_K => 3.0,
                    Format::Q3_K => 7.0,
                    Format::Q4_K => 15.0,
                    Format::Q5_K => 31.0,
                    _ => 63.0,
                };
                for (c, (xs, bs)) in x.chunks_exact(SUB).zip(back.chunks_exact(SUB)).enumerate() {
                    let span = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) * 2.0;
                    for (a, b) in xs.iter().zip(bs) {
                        assert!(
                            (a - b).abs() <= span / levels * 1.5 + span * 0.07,
                            "{format:?} sub-block {c}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn scale_packing_reads_back_every_six_bit_value() {
        // Q4_K/Q5_K: scales and minimums 0..63 through the encoder's packing and back.
        for base in [0u8, 17, 40, 56] {
            let sc: Vec<u8> = (0..8).map(|j| (base + 7 * j) % 64).collect();
            let m: Vec<u8> = (0..8).map(|j| (base + 11 * j + 5) % 64).collect();
            let scales = pack_scale_min_k4(&sc, &m);
            for j in 0..8 {
                assert_eq!(scale_min_k4(&scales, j), (sc[j], m[j]), "j={j}");
            }
        }
    }
}
