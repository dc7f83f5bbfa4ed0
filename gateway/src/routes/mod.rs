//! HTTP handlers, one file per resource. Handlers authenticate, validate, call into the
//! backends and relay, and return `Result<_, ApiError>`; they never format errors.

pub mod admin;
pub mod chat;
pub mod health;
pub mod models;
pub mod responses;
