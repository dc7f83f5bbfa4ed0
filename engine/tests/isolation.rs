//! KV isolation on the real model and on a tiny model of every architecture and K-quant
//! mix, on the CPU backend. The bodies live in `common/isolation_cases.rs`, shared with
//! the CUDA twin in `cuda_backend.rs`; each runs unchanged on every model.

#[path = "common/isolation_cases.rs"]
mod isolation_cases;

use engine::backend::Device;
use isolation_cases::{TestResult, EVERY_MODEL};

#[test]
fn every_token_attends_only_its_own_tenant() -> TestResult {
    for model in EVERY_MODEL {
        isolation_cases::every_token_attends_only_its_own_tenant(Device::Cpu, model)
            .map_err(|e| format!("{model:?}: {e}"))?;
    }
    Ok(())
}

#[test]
fn a_tenants_repeated_prefix_is_reused_with_identical_greedy_output() -> TestResult {
    for model in EVERY_MODEL {
        isolation_cases::a_tenants_repeated_prefix_is_reused_with_identical_greedy_output(Device::Cpu, model)
            .map_err(|e| format!("{model:?}: {e}"))?;
    }
    Ok(())
}

#[test]
fn stale_kv_is_caught_by_the_owner_check() -> TestResult {
    for model in EVERY_MODEL {
        isolation_cases::stale_kv_is_caught_by_the_owner_check(Device::Cpu, model)
            .map_err(|e| format!("{model:?}: {e}"))?;
    }
    Ok(())
}

#[test]
fn without_the_owner_check_stale_kv_leaks_and_every_token_names_the_foreign_tenant() -> TestResult {
    for model in EVERY_MODEL {
        isolation_cases::without_the_owner_check_stale_kv_leaks_and_every_token_names_the_foreign_tenant(
            Device::Cpu,
            model,
        )
        .map_err(|e| format!("{model:?}: {e}"))?;
    }
    Ok(())
}
