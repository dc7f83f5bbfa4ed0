//! The OpenAI wire formats: chat completions, what clients send ([`request`]) and what the
//! gateway answers ([`response`]), and the Responses API ([`responses`]: its requests
//! validated and translated into the chat request both backends serve). No behaviour lives
//! here beyond parsing, validation and that translation.

pub mod request;
pub mod response;
pub mod responses;

pub use request::{ChatRequest, ResponseFormat, ToolChoice};
pub use response::Usage;
