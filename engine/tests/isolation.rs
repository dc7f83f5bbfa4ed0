//! KV isolation on the real model, on the CPU backend. The bodies live in
//! `common/isolation_cases.rs`, shared with the CUDA twin in `cuda_backend.rs`.

#[path = "common/isolation_cases.rs"]
mod isolation_cases;

use engine::backend::Device;
use isolation_cases::TestResult;

#[test]
fn every_token_attends_only_its_own_tenant() -> TestResult {
    isolation_cases::every_token_attends_only_its_own_tenant(Device::Cpu)
}

#[test]
fn a_tenants_repeated_prefix_is_reused_with_identical_greedy_output() -> TestResult {
    isolation_cases::a_tenants_repeated_prefix_is_reused_with_identical_greedy_output(Device::Cpu)
}

#[test]
fn stale_kv_is_caught_by_the_owner_check() -> TestResult {
    isolation_cases::stale_kv_is_caught_by_the_owner_check(Device::Cpu)
}

#[test]
fn without_the_owner_check_stale_kv_leaks_and_every_token_names_the_foreign_tenant() -> TestResult {
    isolation_cases::without_the_owner_check_stale_kv_leaks_and_every_token_names_the_foreign_tenant(Device::Cpu)
}
