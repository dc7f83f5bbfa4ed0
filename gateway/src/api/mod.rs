//! The OpenAI wire format: what clients send ([`request`]) and what the gateway answers
//! ([`response`]). No behaviour lives here beyond parsing and validation.

pub mod request;
pub mod response;
pub mod responses;

pub use request::{ChatRequest, ResponseFormat, ToolChoice};
pub use response::Usage;
