//! crossguard's gateway: an OpenAI-compatible HTTP server in front of the in-process
//! engine or any upstream OpenAI-compatible server.
//!
//! The request path: [`router`] (request id, metrics, logging) -> [`routes`] (auth via
//! [`auth`], validation via [`api`], admission and rate limits via [`limits`]) -> a
//! [`backend`] producing normalised events ->
//! [`response_guard`] (the firewall: what of each choice may reach the client, and what the
//! response's end records) -> [`relay`] writing SSE (chat or legacy text chunks, or the
//! Responses API's events) or one JSON object. A `/v1/responses` request is translated to a
//! chat request first ([`api::responses`]), so every API shares that path from admission on.
//! Around it, [`protection`] fingerprints prompts and responses into the
//! [`provenance`] index, feeds the tenants' [`stats`], and writes [`audit`] records to the
//! [`store`]; [`routes::admin`] reads them back. Configuration is [`config`]; errors that
//! reach a client are [`error::ApiError`]s, always in OpenAI's envelope.
#![forbid(unsafe_code)]

pub mod admin;
pub mod api;
pub mod audit;
pub mod auth;
pub mod backend;
pub mod cli;
pub mod commands;
pub mod config;
pub mod error;
pub mod limits;
pub mod logging;
pub mod login_throttle;
pub mod metrics;
pub mod probing;
pub mod protection;
pub mod provenance;
pub mod redact;
pub mod relay;
pub mod response_guard;
pub mod router;
pub mod routes;
pub mod rules;
pub mod server;
pub mod state;
pub mod stats;
pub mod store;
