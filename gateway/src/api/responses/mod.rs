//! The Responses API (`/v1/responses`): its request, translated to the chat request both
//! backends serve ([`request`]), and the objects written back ([`object`]).

pub mod object;
pub mod request;

pub use object::{ResponseObject, StoredResponse};
pub use request::ResponsesRequest;
