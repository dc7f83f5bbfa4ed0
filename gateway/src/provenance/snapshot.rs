//! The provenance index's snapshot file (embedded store only): its byte layout, written
//! and parsed. Reading and writing the file, and what is in it, are the index's business.
//!
//! Layout (little-endian): magic, tenant count u32, each tenant as u16 length + UTF-8,
//! entry count u64, each entry as hash u64, tenant word u32, expiry u64.

/// One snapshot entry: (hash, tenant word, expiry in Unix seconds).
pub(super) type SnapshotEntry = (u64, u32, u64);

/// First bytes of a snapshot file (format version 1).
const SNAPSHOT_MAGIC: &[u8; 8] = b"CGFPIDX1";

/// The file's bytes.
pub(super) fn encode(tenants: &[std::sync::Arc<str>], entries: &[SnapshotEntry]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(16 + entries.len() * 20);
    buf.extend_from_slice(SNAPSHOT_MAGIC);
    buf.extend_from_slice(&(tenants.len() as u32).to_le_bytes());
    for t in tenants {
        let bytes = t.as_bytes();
        buf.extend_from_slice(&(bytes.len().min(u16::MAX as usize) as u16).to_le_bytes());
        buf.extend_from_slice(&bytes[..bytes.len().min(u16::MAX as usize)]);
    }
    buf.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (h, w, e) in entries {
        buf.extend_from_slice(&h.to_le_bytes());
        buf.extend_from_slice(&w.to_le_bytes());
        buf.extend_from_slice(&e.to_le_bytes());
    }
    buf
}

/// The tenants and entries of a snapshot; `None` if malformed.
pub(super) fn parse(bytes: &[u8]) -> Option<(Vec<String>, Vec<SnapshotEntry>)> {
    let mut at = bytes.strip_prefix(SNAPSHOT_MAGIC.as_slice())?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, rest) = (at.get(..n)?, at.get(n..)?);
        at = rest;
        Some(head)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
    let mut tenants = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let len = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
        tenants.push(String::from_utf8(take(len)?.to_vec()).ok()?);
    }
    let n = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let n = usize::try_from(n).ok()?;
    // Checked against the bytes left before allocating: a corrupt count cannot exhaust memory.
    let body = take(n.checked_mul(20)?)?;
    let entries = body
        .chunks_exact(20)
        .map(|c| {
            let h = u64::from_le_bytes(c[..8].try_into().unwrap_or_default());
            let w = u32::from_le_bytes(c[8..12].try_into().unwrap_or_default());
            let e = u64::from_le_bytes(c[12..].try_into().unwrap_or_default());
            (h, w, e)
        })
        .collect();
    Some((tenants, entries))
}
