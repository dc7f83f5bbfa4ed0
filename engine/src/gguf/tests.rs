//! Tests of the GGUF reader: hand-built files, every truncation, corruptions, random
//! mutations, and the real default model.

use super::*;
use proptest::prelude::*;

/// A GGUF writer for tests: values are written with their ggml type ids.
#[derive(Default)]
pub(crate) struct Builder {
    version: u32,
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    alignment: u64,
    /// Offsets written into tensor infos instead of the real ones: `(tensor index, offset)`.
    fake_offsets: Vec<(usize, u64)>,
}

fn string_bytes(s: &str) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s.as_bytes());
    out
}

impl Builder {
    pub(crate) fn new() -> Builder {
        Builder { version: 3, alignment: 32, ..Builder::default() }
    }

    pub(crate) fn raw(mut self, key: &str, ty: u32, payload: Vec<u8>) -> Builder {
        self.kvs.push((key.to_owned(), ty, payload));
        self
    }

    pub(crate) fn u32(self, key: &str, v: u32) -> Builder {
        self.raw(key, 4, v.to_le_bytes().to_vec())
    }

    pub(crate) fn str(self, key: &str, v: &str) -> Builder {
        self.raw(key, 8, string_bytes(v))
    }

    pub(crate) fn strings(self, key: &str, items: &[&str]) -> Builder {
        let mut p = 8u32.to_le_bytes().to_vec();
        p.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for s in items {
            p.extend(string_bytes(s));
        }
        self.raw(key, 9, p)
    }

    pub(crate) fn i32s(self, key: &str, items: &[i32]) -> Builder {
        let mut p = 5u32.to_le_bytes().to_vec();
        p.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for v in items {
            p.extend_from_slice(&v.to_le_bytes());
        }
        self.raw(key, 9, p)
    }

    pub(crate) fn tensor(self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Builder {
        self.tensor_type_id(name, dims, ty.id(), data)
    }

    fn tensor_type_id(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Builder {
        self.tensors.push((name.to_owned(), dims.to_vec(), ty, data));
        self
    }

    fn fake_offset(mut self, tensor: usize, offset: u64) -> Builder {
        self.fake_offsets.push((tensor, offset));
        self
    }

    pub(crate) fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (key, ty, payload) in &self.kvs {
            out.extend(string_bytes(key));
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(payload);
        }
        let pad = |n: u64| n.div_ceil(self.alignment) * self.alignment;
        let mut offset = 0u64;
        for (i, (name, dims, ty, data)) in self.tensors.iter().enumerate() {
            out.extend(string_bytes(name));
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            let fake = self.fake_offsets.iter().find(|f| f.0 == i).map(|f| f.1);
            out.extend_from_slice(&fake.unwrap_or(offset).to_le_bytes());
            offset = pad(offset + data.len() as u64);
        }
        for (_, _, _, data) in &self.tensors {
            out.resize(pad(out.len() as u64) as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

/// A small file with every scalar type, arrays, an F32 and a Q4_1 tensor.
fn tiny() -> Builder {
    Builder::new()
        .str("general.architecture", "llama")
        .raw("t.u8", 0, vec![200])
        .raw("t.i8", 1, vec![0xff])
        .raw("t.u16", 2, 500u16.to_le_bytes().to_vec())
        .raw("t.i16", 3, (-5i16).to_le_bytes().to_vec())
        .u32("t.u32", 70_000)
        .raw("t.i32", 5, (-7i32).to_le_bytes().to_vec())
        .raw("t.f32", 6, 1.5f32.to_le_bytes().to_vec())
        .raw("t.bool", 7, vec![1])
        .raw("t.u64", 10, (1u64 << 33).to_le_bytes().to_vec())
        .raw("t.i64", 11, (-9i64).to_le_bytes().to_vec())
        .raw("t.f64", 12, 2.25f64.to_le_bytes().to_vec())
        .strings("t.words", &["a", "bc", "ü"])
        .i32s("t.types", &[1, 3, -2])
        .tensor("norm", &[4], GgmlType::F32, (0u8..16).collect())
        .tensor("w", &[32, 2], GgmlType::Q4_1, vec![7u8; 40])
}

#[test]
fn tiny_file_reads_back() {
    let f = GgufFile::from_bytes(tiny().build()).unwrap();
    let m = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(m.architecture().unwrap(), "llama");
    assert_eq!(m.u32("t.u8").unwrap(), 200);
    assert_eq!(m.get("t.i8"), Some(&MetaValue::I8(-1)));
    assert_eq!(m.u32("t.u16").unwrap(), 500);
    assert_eq!(m.get("t.i16"), Some(&MetaValue::I16(-5)));
    assert_eq!(m.u32("t.u32").unwrap(), 70_000);
    assert_eq!(m.f32("t.f32").unwrap(), 1.5);
    assert!(m.bool("t.bool").unwrap());
    assert_eq!(m.u64("t.u64").unwrap(), 1 << 33);
    assert_eq!(m.get("t.i64"), Some(&MetaValue::I64(-9)));
    assert_eq!(m.f32("t.f64").unwrap(), 2.25);
    assert_eq!(m.string_array("t.words").unwrap(), ["a", "bc", "ü"]);
    assert_eq!(m.i32_array("t.types").unwrap(), [1, 3, -2]);
    assert_eq!(f.tensor_infos().len(), 2);

    let norm = f.tensor("norm").unwrap();
    assert_eq!((norm.ty, norm.dims), (GgmlType::F32, &[4u64][..]));
    assert_eq!(norm.data, &(0u8..16).collect::<Vec<_>>()[..]);
    let w = f.tensor("w").unwrap();
    assert_eq!((w.ty, w.dims, w.data.len()), (GgmlType::Q4_1, &[32u64, 2][..], 40));
    assert!(matches!(f.tensor("nope"), Err(Error::MissingTensor { name }) if name == "nope"));
}

#[test]
fn opens_from_disk_and_maps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    std::fs::write(&path, tiny().build()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor("w").unwrap().data.as_ptr() as u64 % f.alignment(), 0);
    std::fs::write(&path, b"").unwrap();
    let err = GgufFile::open(&path).unwrap_err().to_string();
    assert!(err.contains("tiny.gguf") && err.contains("truncated"), "{err}");
}

#[test]
fn released_tensor_bytes_read_back_unchanged() {
    // A tensor over many pages, after the small ones, so that its first and last pages are
    // shared with its neighbours.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let bytes = tiny().tensor("big", &[50_000], GgmlType::F32, big.clone()).build();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let norm: Vec<u8> = (0u8..16).collect();
    for f in [GgufFile::open(&path).unwrap(), GgufFile::from_bytes(bytes).unwrap()] {
        f.release(f.tensor("big").unwrap().data);
        f.release(&f.tensor("big").unwrap().data[1000..5000]);
        f.release(&big);
        f.release(&[]);
        assert_eq!(f.tensor("big").unwrap().data, &big[..]);
        assert_eq!(f.tensor("norm").unwrap().data, &norm[..]);
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = tiny().build();
    for len in 0..bytes.len() {
        let result = GgufFile::from_bytes(bytes[..len].to_vec());
        assert!(result.is_err(), "truncated to {len} of {} bytes parsed", bytes.len());
    }
}

/// Overwrites 8 bytes at `at` (little-endian `value`).
fn patch_u64(mut bytes: Vec<u8>, at: usize, value: u64) -> Vec<u8> {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    bytes
}

fn reason(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => "parsed".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn corrupt_headers_are_named() {
    let good = Builder::new().str("k", "v").build();
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert!(reason(bad_magic).contains("not a GGUF file"));
    let mut v1 = good.clone();
    v1[4] = 1;
    assert!(reason(v1).contains("version 1"));
    let mut be = good.clone();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(reason(be).contains("big-endian"));
    let r = reason(patch_u64(good.clone(), 16, u64::MAX));
    assert!(r.contains("metadata count 18446744073709551615 at offset 16 cannot fit"), "{r}");
    let r = reason(patch_u64(good.clone(), 8, 1 << 40));
    assert!(r.contains("tensor count 1099511627776"), "{r}");
    // The key's length is the first field after the counts.
    let r = reason(patch_u64(good, 24, 1 << 50));
    assert!(r.contains("metadata key #0 length"), "{r}");
}

#[test]
fn corrupt_metadata_values_are_named() {
    let huge_array = {
        let mut p = 5u32.to_le_bytes().to_vec();
        p.extend_from_slice(&u64::MAX.to_le_bytes());
        p
    };
    let r = reason(Builder::new().raw("arr", 9, huge_array).build());
    assert!(r.contains("metadata arr array length"), "{r}");
    let r = reason(Builder::new().raw("b", 7, vec![2]).build());
    assert!(r.contains("metadata b: bool byte 2"), "{r}");
    let r = reason(Builder::new().raw("x", 13, vec![0; 8]).build());
    assert!(r.contains("metadata x: unknown value type 13"), "{r}");
    let r = reason(Builder::new().raw("s", 8, vec![1, 0, 0, 0, 0, 0, 0, 0, 0xff]).build());
    assert!(r.contains("not UTF-8"), "{r}");
    let nested = {
        let mut p = 9u32.to_le_bytes().to_vec(); // array of arrays of arrays
        p.extend_from_slice(&1u64.to_le_bytes());
        p.extend_from_slice(&9u32.to_le_bytes());
        p.extend_from_slice(&1u64.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        p
    };
    let r = reason(Builder::new().raw("deep", 9, nested).build());
    assert!(r.contains("nested deeper"), "{r}");
    let r = reason(Builder::new().str("k", "a").str("k", "b").build());
    assert!(r.contains("appears twice"), "{r}");
    let r = reason(Builder::new().u32("general.alignment", 24).build());
    assert!(r.contains("not a power of two"), "{r}");
}

#[test]
fn corrupt_tensor_infos_are_named() {
    let one =
        |dims: &[u64], ty: GgmlType, len: usize| Builder::new().tensor("blk.3.attn_q.weight", dims, ty, vec![0; len]);
    let r = reason(one(&[1, 1, 1, 1, 1], GgmlType::F32, 4).build());
    assert!(r.contains("5 dimensions"), "{r}");
    let r = reason(one(&[33], GgmlType::Q4_1, 20).build());
    assert!(r.contains("row length 33 is not a multiple of Q4_1's block of 32"), "{r}");
    let r = reason(one(&[1 << 32, 1 << 32, 1 << 2], GgmlType::F32, 4).build());
    assert!(r.contains("overflows"), "{r}");
    let r = reason(one(&[32, 4], GgmlType::Q4_1, 40).build());
    assert!(r.contains("tensor blk.3.attn_q.weight: data [offset 96, len 80] runs past end of file (size 136)"), "{r}");
    let unknown = Builder::new().tensor_type_id("iq", &[256], 16, vec![0; 66]);
    assert!(reason(unknown.build()).contains("tensor iq: unsupported ggml type id 16"));
    let r = reason(one(&[4], GgmlType::F32, 16).fake_offset(0, 4).build());
    assert!(r.contains("not a multiple of the alignment 32"), "{r}");
    let r = reason(
        Builder::new()
            .tensor("a", &[4], GgmlType::F32, vec![0; 16])
            .tensor("a", &[4], GgmlType::F32, vec![0; 16])
            .build(),
    );
    assert!(r.contains("tensor a appears twice"), "{r}");
}

#[test]
fn overlapping_tensors_are_rejected() {
    let b = Builder::new()
        .tensor("a", &[16], GgmlType::F32, vec![0; 64])
        .tensor("b", &[4], GgmlType::F32, vec![0; 16])
        .fake_offset(1, 32);
    let r = reason(b.build());
    assert!(r.contains("overlaps"), "{r}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn random_mutations_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = tiny().build();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(f) = GgufFile::from_bytes(bytes) {
            for info in f.tensor_infos() {
                let t = f.tensor(&info.name).unwrap();
                prop_assert_eq!(t.data.len() as u64, info.size);
            }
        }
    }
}

/// The real default model: metadata and the layout of every tensor.
#[test]
fn default_model_layout() {
    let path = crate::fetch::ensure_default_model(&crate::fetch::default_cache_dir()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let m = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(m.architecture().unwrap(), "llama");
    assert_eq!(m.u32("llama.block_count").unwrap(), 30);
    assert_eq!(m.u32("llama.context_length").unwrap(), 8192);
    assert_eq!(m.u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(m.u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(m.u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(m.u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(m.f32("llama.rope.freq_base").unwrap(), 100_000.0);
    assert_eq!(m.f32("llama.attention.layer_norm_rms_epsilon").unwrap(), 1e-5);
    assert_eq!(m.str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(m.string_array("tokenizer.ggml.tokens").unwrap().len(), 49152);

    let (e, f_, kv) = (576, 1536, 192);
    let mut expected = vec![
        ("token_embd.weight".to_string(), GgmlType::Q8_0, vec![e, 49152]),
        ("output_norm.weight".to_string(), GgmlType::F32, vec![e]),
    ];
    for i in 0..30 {
        let layer: [(&str, GgmlType, Vec<u64>); 9] = [
            ("attn_norm", GgmlType::F32, vec![e]),
            ("ffn_norm", GgmlType::F32, vec![e]),
            ("attn_q", GgmlType::Q4_1, vec![e, e]),
            ("attn_k", GgmlType::Q4_1, vec![e, kv]),
            ("attn_v", GgmlType::Q4_1, vec![e, kv]),
            ("attn_output", GgmlType::Q4_1, vec![e, e]),
            ("ffn_gate", GgmlType::Q4_1, vec![e, f_]),
            ("ffn_up", GgmlType::Q4_1, vec![e, f_]),
            ("ffn_down", GgmlType::Q4_1, vec![f_, e]),
        ];
        expected.extend(layer.map(|(n, t, d)| (format!("blk.{i}.{n}.weight"), t, d)));
    }
    assert_eq!(f.tensor_infos().len(), expected.len());
    for (name, ty, dims) in expected {
        let t = f.tensor(&name).unwrap();
        assert_eq!((t.ty, t.dims), (ty, &dims[..]), "{name}");
        let elems: u64 = dims.iter().product();
        let bytes = elems / ty.block_elems() as u64 * ty.block_bytes() as u64;
        assert_eq!(t.data.len() as u64, bytes, "{name}");
    }
    let q = f.tensor_infos().iter().filter(|t| t.ty == GgmlType::Q4_1).count();
    assert_eq!(q, 210);
}
