//! The firewall.
#![forbid(unsafe_code)]
