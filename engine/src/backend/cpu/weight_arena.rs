//! One mapping for all of a model's packed matrices, in transparent huge pages where the
//! kernel grants them.
//!
//! Decode reads every weight once per token: 97 MB for the default model, some 24,000
//! pages of 4 KiB, far more than a core's TLB holds, so with ordinary pages each page is a
//! TLB miss and a page walk (a two-dimensional one under a hypervisor); in 2 MiB pages the
//! model takes 48 entries. With the THP mode `madvise` (Debian's default) only memory that
//! asks gets huge pages, and a matrix of its own is too small to fill one: so all of them
//! share one anonymous mapping, asked for huge pages and used from a 2 MiB boundary on.
//! Where the kernel gives none (mode `never`, no memory to compact), the same bytes sit in
//! ordinary pages and nothing else changes.
//!
//! On a Xeon whose L3 holds the model, two engines in one process (the same model, in the
//! two kinds of memory) alternating 64-token decode calls, 12 rounds a run: decode
//! 1.05-1.10x faster (medians of five runs) at 1 thread and 1.04-1.10x (three) at 2. The
//! KV cache, read as much at long contexts, gained 1.02-1.03x from the same, within this
//! host's noise, and stays in ordinary pages.

use std::io;
use std::ops::Range;
use std::sync::Arc;

use memmap2::{Mmap, MmapMut};

/// The size of a transparent huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Parts start at a cache-line boundary (the kernels' loads are then never split).
const PART_ALIGN: usize = 64;

/// Bytes of one part of a shared read-only mapping.
#[derive(Debug, Clone)]
pub(crate) struct Region {
    map: Arc<Mmap>,
    range: Range<usize>,
}

impl Region {
    pub(crate) fn bytes(&self) -> &[u8] {
        self.map.get(self.range.clone()).unwrap_or(&[])
    }

    /// Bytes of the whole mapping this region lies in that the kernel backs with huge
    /// pages now (Linux; `None` where that cannot be read).
    pub(crate) fn mapping_huge_page_bytes(&self) -> Option<usize> {
        huge_page_bytes_at(self.map.as_ptr() as usize)
    }
}

/// Lays out parts of `sizes` bytes back to back in one anonymous mapping asked for huge
/// pages, lets `fill(i, part)` write part `i` (zeroed before), and returns the parts,
/// read-only from then on.
pub(crate) fn lay_out(sizes: &[usize], mut fill: impl FnMut(usize, &mut [u8])) -> io::Result<Vec<Region>> {
    let overflow = || io::Error::new(io::ErrorKind::OutOfMemory, "weights overflow the address space");
    let mut starts = Vec::with_capacity(sizes.len());
    let mut end = 0usize;
    for &size in sizes {
        let start = end.next_multiple_of(PART_ALIGN);
        starts.push(start);
        end = start.checked_add(size).ok_or_else(overflow)?;
    }
    // A huge page needs a 2 MiB-aligned address: map one page more and start at the
    // first boundary (untouched pages cost nothing).
    let mut map = MmapMut::map_anon(end.checked_add(HUGE_PAGE).ok_or_else(overflow)?)?;
    #[cfg(target_os = "linux")]
    {
        // Only a hint: a kernel without THP refuses it, and ordinary pages then serve.
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    let base = map.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
    for (i, (&start, &size)) in starts.iter().zip(sizes).enumerate() {
        fill(i, &mut map[base + start..base + start + size]);
    }
    let map = Arc::new(map.make_read_only()?);
    Ok(starts
        .iter()
        .zip(sizes)
        .map(|(&start, &size)| Region { map: Arc::clone(&map), range: base + start..base + start + size })
        .collect())
}

/// `AnonHugePages` of the mapping of this process that holds `addr`, in bytes.
fn huge_page_bytes_at(addr: usize) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut lines = smaps.lines();
    // Mapping headers read `start-end perms ...`, in hex; fields follow as `Name: N kB`.
    let holds = |line: &str| {
        let range = line.split_whitespace().next()?;
        let (start, end) = range.split_once('-')?;
        Some(usize::from_str_radix(start, 16).ok()? <= addr && addr < usize::from_str_radix(end, 16).ok()?)
    };
    lines.find(|l| holds(l) == Some(true))?;
    let field = lines.find(|l| l.starts_with("AnonHugePages:"))?;
    let kib: usize = field.trim_start_matches("AnonHugePages:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_keep_what_was_written_at_cache_line_boundaries() -> io::Result<()> {
        let sizes = [3, 0, 200, 64, 1];
        let parts = lay_out(&sizes, |i, part| part.iter_mut().enumerate().for_each(|(j, b)| *b = (i * 31 + j) as u8))?;
        assert_eq!(parts.len(), sizes.len());
        for (i, (part, &size)) in parts.iter().zip(&sizes).enumerate() {
            let bytes = part.bytes();
            assert_eq!(bytes.len(), size);
            assert!(bytes.iter().enumerate().all(|(j, &b)| b == (i * 31 + j) as u8), "part {i}");
            assert_eq!(bytes.as_ptr() as usize % PART_ALIGN, 0, "part {i}");
        }
        // Disjoint: each part's first byte follows the previous part's last.
        let ends: Vec<(usize, usize)> = parts.iter().map(|p| (p.range.start, p.range.end)).collect();
        assert!(ends.windows(2).all(|w| w[0].1 <= w[1].0));
        Ok(())
    }

    #[test]
    fn the_first_part_starts_on_a_huge_page_boundary() -> io::Result<()> {
        let parts = lay_out(&[HUGE_PAGE + 5], |_, part| part.fill(7))?;
        assert_eq!(parts[0].bytes().as_ptr() as usize % HUGE_PAGE, 0);
        assert!(parts[0].bytes().iter().all(|&b| b == 7));
        Ok(())
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_mapping_is_found_in_smaps() -> io::Result<()> {
        let parts = lay_out(&[4096], |_, part| part.fill(1))?;
        assert!(parts[0].mapping_huge_page_bytes().is_some());
        Ok(())
    }
}
