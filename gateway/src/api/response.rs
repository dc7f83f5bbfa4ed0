//! OpenAI wire types the gateway writes: completions, stream chunks, usage, model lists.
//! Field names and nullability follow OpenAI's API so unmodified SDKs parse them.

use serde::Serialize;

use crate::backend::{TokenLogprob, TopLogprob};

/// `usage` on a completion and on the final stream chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// A non-streaming `chat.completion` object.
#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Choice {
    pub index: u32,
    pub message: Message,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Message {
    pub role: String,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// `logprobs` of a choice: one entry per generated token.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Logprobs {
    pub content: Vec<LogprobContent>,
}

impl Logprobs {
    /// The wire form of entries the response guard released.
    pub fn of(entries: &[TokenLogprob]) -> Logprobs {
        Logprobs { content: entries.iter().map(LogprobContent::of).collect() }
    }
}

/// One `logprobs.content` entry. `bytes` is always the UTF-8 of `token`, written here:
/// a backend's own `bytes` never reach a client (they could spell anything).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogprobContent {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprobContent>,
}

impl LogprobContent {
    fn of(entry: &TokenLogprob) -> LogprobContent {
        LogprobContent {
            token: entry.token.clone(),
            logprob: entry.logprob,
            bytes: entry.token.as_bytes().to_vec(),
            top_logprobs: entry.top_logprobs.iter().map(TopLogprobContent::of).collect(),
        }
    }
}

impl From<LogprobContent> for TokenLogprob {
    /// Back to the typed entry (its `bytes` are the token's, see [`LogprobContent`]).
    fn from(e: LogprobContent) -> TokenLogprob {
        TokenLogprob {
            token: e.token,
            logprob: e.logprob,
            top_logprobs: e
                .top_logprobs
                .into_iter()
                .map(|t| TopLogprob { token: t.token, logprob: t.logprob })
                .collect(),
        }
    }
}

/// One alternative in `top_logprobs`; `bytes` as in [`LogprobContent`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprobContent {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

impl TopLogprobContent {
    fn of(top: &TopLogprob) -> TopLogprobContent {
        TopLogprobContent { token: top.token.clone(), logprob: top.logprob, bytes: top.token.as_bytes().to_vec() }
    }
}

/// A `chat.completion.chunk` SSE payload.
#[derive(Debug, Serialize)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<&'a str>,
    /// Present (as `null` or the totals) only when the client asked for usage.
    #[serde(skip_serializing_if = "UsageField::is_absent")]
    pub usage: UsageField,
}

/// The three states of a chunk's `usage` field.
#[derive(Debug, Clone, Copy)]
pub enum UsageField {
    Absent,
    Null,
    Some(Usage),
}

impl UsageField {
    pub fn is_absent(&self) -> bool {
        matches!(self, UsageField::Absent)
    }
}

impl Serialize for UsageField {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            UsageField::Absent | UsageField::Null => s.serialize_none(),
            UsageField::Some(u) => u.serialize(s),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallChunk>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallChunk {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionChunk,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FunctionChunk {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Serialize)]
pub struct ModelObject<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[derive(Debug, Serialize)]
pub struct ModelList<'a> {
    pub object: &'static str,
    pub data: Vec<ModelObject<'a>>,
}

/// A legacy text completion (`POST /v1/completions`): the whole answer, or one SSE chunk.
#[derive(Debug, Serialize)]
pub struct TextCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "UsageField::is_absent")]
    pub usage: UsageField,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct TextChoice {
    pub text: String,
    pub index: u32,
    pub logprobs: Option<TextLogprobs>,
    pub finish_reason: Option<String>,
}

/// The legacy `logprobs` shape: parallel lists, alternatives as token -> logprob maps,
/// each token's character offset in the choice's text.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TextLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f64>,
    pub top_logprobs: Vec<std::collections::BTreeMap<String, f64>>,
    pub text_offset: Vec<usize>,
}

impl TextLogprobs {
    /// `entries` in the legacy shape, offsets counted from `offset`.
    pub fn of(entries: &[LogprobContent], mut offset: usize) -> TextLogprobs {
        let mut out = TextLogprobs::default();
        for e in entries {
            out.tokens.push(e.token.clone());
            out.token_logprobs.push(e.logprob);
            out.top_logprobs.push(e.top_logprobs.iter().map(|t| (t.token.clone(), t.logprob)).collect());
            out.text_offset.push(offset);
            offset += e.token.chars().count();
        }
        out
    }
}

impl TextCompletion {
    /// The legacy form of a chat completion the guard released (content becomes `text`).
    pub fn from_chat(c: ChatCompletion) -> TextCompletion {
        let choices = c
            .choices
            .into_iter()
            .map(|choice| TextChoice {
                text: choice.message.content.unwrap_or_default(),
                index: choice.index,
                logprobs: choice.logprobs.map(|l| TextLogprobs::of(&l.content, 0)),
                finish_reason: choice.finish_reason,
            })
            .collect();
        TextCompletion {
            id: c.id,
            object: "text_completion",
            created: c.created,
            model: c.model,
            choices,
            usage: c.usage.map_or(UsageField::Absent, UsageField::Some),
            system_fingerprint: c.system_fingerprint,
        }
    }
}
