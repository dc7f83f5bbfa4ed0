//! Shared helpers for the end-to-end tests: spawn the real binary, scripted upstreams.
