//! The gateway library.
#![forbid(unsafe_code)]
