//! Compute backends: the CPU backend and its CUDA twin, checked against each other by
//! the same tests.
//!
//! A backend owns the numeric kernels (quantized matrix products, attention arithmetic)
//! and where they run. It knows nothing of tokenizers or requests: the model hands it
//! weights in ggml block layouts and f32 activations.

pub mod cpu;
pub mod cuda;

use std::fmt;
use std::str::FromStr;

/// Where the forward pass runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend.
    #[default]
    Cpu,
    /// The first GPU; no usable GPU is a load error.
    Cuda,
    /// The first GPU when one is usable, else the CPU (said once in the log).
    Auto,
}

impl Device {
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
            Device::Auto => "auto",
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            "auto" => Ok(Device::Auto),
            other => Err(format!("{other:?} is not a device (\"auto\", \"cpu\" or \"cuda\")")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_from_their_names_and_nothing_else() {
        for d in [Device::Cpu, Device::Cuda, Device::Auto] {
            assert_eq!(d.as_str().parse::<Device>(), Ok(d));
        }
        assert!("gpu".parse::<Device>().is_err());
        assert_eq!(Device::default(), Device::Cpu);
    }
}
