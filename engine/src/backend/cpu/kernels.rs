//! Which SIMD kernel family runs: the widest this CPU has, detected at run time.

use super::{avx2, avx512, packed};

/// The kernel family a backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// AVX-512 F/BW with VNNI integer dot products.
    Avx512,
    /// AVX2, FMA and F16C.
    Avx2,
    /// Portable Rust, any CPU.
    Portable,
}

impl Kernels {
    /// The fastest family this CPU runs.
    pub fn best() -> Kernels {
        [Kernels::Avx512, Kernels::Avx2].into_iter().find(|k| k.available()).unwrap_or(Kernels::Portable)
    }

    /// Whether this CPU runs the family.
    pub fn available(self) -> bool {
        self == Kernels::Portable || self.simd(false).is_some()
    }

    /// The family's SIMD kernel, if it has one and this CPU runs it. `streamed` asks
    /// for weights prefetched past the caches.
    pub(super) fn simd(self, streamed: bool) -> Option<packed::SimdKernel> {
        match self {
            Kernels::Avx512 => avx512::kernel(streamed),
            Kernels::Avx2 => avx2::kernel(streamed),
            Kernels::Portable => None,
        }
    }
}

/// The size of the largest data cache (the last level), as Linux reports it.
pub(super) fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let read = |path: std::path::PathBuf| std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned());
    let sizes = dir.flatten().filter_map(|index| {
        let path = index.path();
        if read(path.join("type"))? == "Instruction" {
            return None;
        }
        let level: u32 = read(path.join("level"))?.parse().ok()?;
        Some((level, parse_cache_size(&read(path.join("size"))?)?))
    });
    sizes.max().map(|(_, bytes)| bytes)
}

/// "32768K", "1M", "512" (bytes).
pub(super) fn parse_cache_size(s: &str) -> Option<usize> {
    let (digits, unit) = match s.strip_suffix('K') {
        Some(d) => (d, 1 << 10),
        None => match s.strip_suffix('M') {
            Some(d) => (d, 1 << 20),
            None => (s, 1),
        },
    };
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_as_linux_writes_them() {
        assert_eq!(
            [parse_cache_size("32768K"), parse_cache_size("1M"), parse_cache_size("512")],
            [Some(32 << 20), Some(1 << 20), Some(512)]
        );
        assert_eq!(
            [parse_cache_size(""), parse_cache_size("xK"), parse_cache_size("99999999999999999999M")],
            [None, None, None]
        );
    }
}
