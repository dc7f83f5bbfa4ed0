//! The Responses API (`/v1/responses`): its request, translated to the chat request both
//! backends serve ([`request`], its `input` items in `input`), and the objects written back
//! ([`object`]).

mod input;
pub mod object;
pub mod request;

pub use object::{ResponseObject, StoredResponse};
pub use request::ResponsesRequest;
