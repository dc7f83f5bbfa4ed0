//! `chat.completion.chunk` streams (and the legacy `text_completion` ones).
//!
//! Invariants: every choice's first chunk carries `role`, no choice gets a second role
//! chunk; usage (when asked for) is the last chunk before `[DONE]`, with `"usage": null` on
//! the others as OpenAI does; an error after the first byte becomes a
//! `data: {"error": ...}` event and the stream ends without `[DONE]`, which the official
//! SDKs raise as an API error.

use std::collections::{BTreeMap, BTreeSet};

use super::{error_frame, sse_frame, Closing, Framing};
use crate::api::response::{
    ChatChunk, ChunkChoice, Delta, Logprobs, TextChoice, TextCompletion, TextLogprobs, UsageField,
};
use crate::api::Usage;
use crate::backend::BackendEvent;
use crate::error::ApiError;

/// Identity of the response being relayed.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    /// Which API's chunks the stream is written as.
    pub shape: Shape,
}

/// The API a chunk stream is written for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Shape {
    /// `chat.completion(.chunk)`.
    #[default]
    Chat,
    /// Legacy `text_completion`: each choice's content as `text`, no roles or tool calls.
    Text,
}

/// Writes chat (or legacy text) chunks.
pub struct ChunkFraming {
    meta: ResponseMeta,
    fingerprint: Option<String>,
    role_sent: BTreeSet<u32>,
    /// Legacy shape: characters of text each choice has sent (for `text_offset`).
    text_offsets: BTreeMap<u32, usize>,
    usage: Option<Usage>,
}

impl ChunkFraming {
    pub fn new(meta: ResponseMeta) -> ChunkFraming {
        ChunkFraming { meta, fingerprint: None, role_sent: BTreeSet::new(), text_offsets: BTreeMap::new(), usage: None }
    }

    /// The SSE frame for one event, if it produces one now.
    fn frame_for(&mut self, event: BackendEvent) -> Option<Vec<u8>> {
        let usage_field = if self.meta.include_usage { UsageField::Null } else { UsageField::Absent };
        if self.meta.shape == Shape::Text {
            return self.text_frame_for(event, usage_field);
        }
        match event {
            BackendEvent::Usage(u) => {
                // Held back: usage goes last, after every choice has finished.
                self.usage = Some(u);
                None
            }
            BackendEvent::Delta(d) => {
                let role = self.take_role(d.index, d.role.clone());
                let choice = ChunkChoice {
                    index: d.index,
                    logprobs: (!d.logprobs.is_empty()).then(|| Logprobs::of(&d.logprobs)),
                    delta: Delta { role, content: d.content, refusal: d.refusal, tool_calls: d.tool_calls },
                    finish_reason: None,
                };
                Some(self.chunk(vec![choice], usage_field))
            }
            BackendEvent::Finish { index, reason } => {
                let role = self.take_role(index, None);
                let choice = ChunkChoice {
                    index,
                    delta: Delta { role, ..Delta::default() },
                    logprobs: None,
                    finish_reason: Some(reason),
                };
                Some(self.chunk(vec![choice], usage_field))
            }
        }
    }

    /// [`ChunkFraming::frame_for`] for the legacy shape.
    fn text_frame_for(&mut self, event: BackendEvent, usage: UsageField) -> Option<Vec<u8>> {
        let choice = match event {
            BackendEvent::Usage(u) => {
                self.usage = Some(u);
                return None;
            }
            BackendEvent::Delta(d) => {
                let text = d.content.unwrap_or_default();
                if text.is_empty() && d.logprobs.is_empty() {
                    return None;
                }
                let offset = self.text_offsets.entry(d.index).or_insert(0);
                let logprobs =
                    (!d.logprobs.is_empty()).then(|| TextLogprobs::of(&Logprobs::of(&d.logprobs).content, *offset));
                *offset += text.chars().count();
                TextChoice { text, index: d.index, logprobs, finish_reason: None }
            }
            BackendEvent::Finish { index, reason } => {
                TextChoice { text: String::new(), index, logprobs: None, finish_reason: Some(reason) }
            }
        };
        Some(self.text_chunk(vec![choice], usage))
    }

    fn text_chunk(&self, choices: Vec<TextChoice>, usage: UsageField) -> Vec<u8> {
        let chunk = TextCompletion {
            id: self.meta.id.clone(),
            object: "text_completion",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices,
            usage,
            system_fingerprint: self.fingerprint.clone(),
        };
        sse_frame(&chunk)
    }

    /// `Some("assistant")` (or the backend's role) the first time a choice speaks.
    fn take_role(&mut self, index: u32, role: Option<String>) -> Option<String> {
        self.role_sent.insert(index).then(|| role.unwrap_or_else(|| "assistant".to_owned()))
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: UsageField) -> Vec<u8> {
        let chunk = ChatChunk {
            id: &self.meta.id,
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: &self.meta.model,
            choices,
            system_fingerprint: self.fingerprint.as_deref(),
            usage,
        };
        sse_frame(&chunk)
    }
}

impl Framing for ChunkFraming {
    fn open(&mut self, fingerprint: Option<String>) -> Vec<u8> {
        self.fingerprint = fingerprint;
        Vec::new()
    }

    fn events(&mut self, events: Vec<BackendEvent>, out: &mut Vec<u8>) {
        for event in events {
            if let Some(frame) = self.frame_for(event) {
                out.extend_from_slice(&frame);
            }
        }
    }

    fn fail(&mut self, error: &ApiError, out: &mut Vec<u8>) {
        out.extend_from_slice(&error_frame(error));
    }

    fn close(&mut self) -> Closing {
        let mut frames = Vec::new();
        if let Some(usage) = self.usage.filter(|_| self.meta.include_usage) {
            let frame = match self.meta.shape {
                Shape::Chat => self.chunk(Vec::new(), UsageField::Some(usage)),
                Shape::Text => self.text_chunk(Vec::new(), UsageField::Some(usage)),
            };
            frames.extend_from_slice(&frame);
        }
        frames.extend_from_slice(b"data: [DONE]\n\n");
        Closing { frames, before: None }
    }
}
