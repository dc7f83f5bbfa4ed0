//! The model's chat template (`tokenizer.chat_template`), rendered with minijinja.
//!
//! Hugging Face chat templates are Jinja2 run in a sandbox with `trim_blocks` and
//! `lstrip_blocks`, a `raise_exception(message)` global, a `tojson` filter that formats
//! like Python's `json.dumps(..., ensure_ascii=False)` and, for newer templates,
//! `strftime_now(format)`. This module provides that environment, so the prompt text is
//! the one the model was trained with. What a template cannot show — a role it rejects, a
//! `null` content it concatenates, tool calls it ignores — is rewritten into what it can
//! (`adapt`); whatever still fails is an [`Error::Template`] (a client error for the
//! gateway), never a panic. Tokenizing the rendered prompt is the caller's job
//! (with `parse_special = true`, so the template's control tokens are recognised).

mod adapt;
mod python;

use minijinja::value::Value;
use minijinja::Environment;
use serde::Serialize;

pub use adapt::Abilities;

use crate::gguf::GgufFile;
use crate::{Error, Result};

const TEMPLATE_NAME: &str = "chat";

/// One chat message, in OpenAI's shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// `None` is passed to the template as `none`, as Hugging Face does.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with a role and text content.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.to_owned(), content: Some(content.to_owned()), ..ChatMessage::default() }
    }
}

/// A compiled chat template with the model's BOS and EOS token texts.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    abilities: Abilities,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

fn template_error(e: &minijinja::Error) -> Error {
    // The detail (line, the template's own raise_exception message) helps the client fix
    // the request; the template source itself is not user data.
    let mut reason = e.to_string();
    if let Some(detail) = e.detail() {
        if !reason.contains(detail) {
            reason = format!("{reason}: {detail}");
        }
    }
    Error::Template { reason }
}

/// The turn format of Gemma models (their vocabulary's `<start_of_turn>`), for files that
/// carry no template: a system message opens the first user turn, as Gemma's own template
/// does.
const GEMMA_TURNS: &str = r#"{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set first = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}
{%- else -%}{%- set first = '' -%}{%- set turns = messages -%}{%- endif -%}
{%- for m in turns -%}
{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' + (first if loop.first else '') + ((m['content'] or '') | trim) + '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"#;

/// ChatML, for files without a template whose vocabulary is not Gemma's.
const CHATML: &str = r#"{%- for m in messages -%}
{{ '<|im_start|>' + m['role'] + '\n' + (m['content'] or '') + '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"#;

impl ChatTemplate {
    /// The template in `tokenizer.chat_template`, with BOS/EOS texts from the vocabulary;
    /// a file without one gets Gemma's turns if its vocabulary has them, else ChatML
    /// (llama.cpp's fallback), and a warning.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate> {
        let m = file.metadata();
        let tokens = m.string_array("tokenizer.ggml.tokens")?;
        let source = match m.get("tokenizer.chat_template") {
            Some(_) => m.str("tokenizer.chat_template")?,
            None => {
                let gemma = tokens.contains(&"<start_of_turn>");
                tracing::warn!(
                    fallback = if gemma { "gemma turns" } else { "chatml" },
                    "the model file has no chat template (tokenizer.chat_template)"
                );
                if gemma {
                    GEMMA_TURNS
                } else {
                    CHATML
                }
            }
        };
        let token_text = |key: &str| -> Result<String> {
            if m.get(key).is_none() {
                return Ok(String::new());
            }
            let id = m.u32(key)? as usize;
            tokens.get(id).map(|t| (*t).to_owned()).ok_or_else(|| Error::Metadata {
                key: key.to_owned(),
                reason: format!("token id {id} is outside the vocabulary ({})", tokens.len()),
            })
        };
        let bos = token_text("tokenizer.ggml.bos_token_id")?;
        let eos = token_text("tokenizer.ggml.eos_token_id")?;
        ChatTemplate::new(source, &bos, &eos)
    }

    /// Compiles `source` with the Hugging Face environment.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", python::raise_exception);
        env.add_function("strftime_now", python::strftime_now);
        env.add_filter("tojson", python::tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned()).map_err(|e| template_error(&e))?;
        let mut template = ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            abilities: Abilities::default(),
        };
        template.abilities =
            Abilities::probe(source, |messages, tools| template.render_verbatim(messages, tools, false));
        Ok(template)
    }

    /// What this template shows of a conversation.
    pub fn abilities(&self) -> &Abilities {
        &self.abilities
    }

    /// Renders a conversation, rewritten into what the template shows; `tools` is
    /// OpenAI's tool list (or `none`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_verbatim(&self.abilities.adapt(messages), tools, add_generation_prompt)
    }

    fn render_verbatim(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| template_error(&e))?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools.map_or(Value::from(()), Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        template.render(ctx).map_err(|e| template_error(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Fixture {
        cases: Vec<Case>,
    }

    #[derive(serde::Deserialize)]
    struct Case {
        name: String,
        messages: Vec<ChatMessage>,
        add_generation_prompt: bool,
        rendered: String,
    }

    fn smollm2() -> ChatTemplate {
        let path = crate::fetch::ensure_default_model(&crate::fetch::default_cache_dir()).unwrap();
        ChatTemplate::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
    }

    #[test]
    fn smollm2_renders_like_jinja2() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenizer_chat_template.json");
        let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let template = smollm2();
        for case in &fixture.cases {
            let got = template.render(&case.messages, None, case.add_generation_prompt).unwrap();
            assert_eq!(got, case.rendered, "{}", case.name);
        }
    }

    #[test]
    fn the_fallback_templates_render_gemma_turns_and_chatml() {
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", " Hi "),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("user", "Bye"),
        ];
        let gemma = ChatTemplate::new(GEMMA_TURNS, "<bos>", "<eos>").unwrap().render(&messages, None, true).unwrap();
        assert_eq!(
            gemma,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        let chatml = ChatTemplate::new(CHATML, "", "").unwrap().render(&messages[1..2], None, true).unwrap();
        assert_eq!(chatml, "<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn smollm2_system_user_exact() {
        let messages = [ChatMessage::new("system", "You are a terse assistant."), ChatMessage::new("user", "Hi")];
        let got = smollm2().render(&messages, None, true).unwrap();
        assert_eq!(
            got,
            "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn smollm2_renders_a_tool_calling_conversation() {
        // LangChain's second turn: `content: null` beside the calls, then the result.
        let messages = [
            ChatMessage::new("user", "weather?"),
            ChatMessage {
                role: "assistant".into(),
                content: None,
                tool_calls: Some(
                    serde_json::json!([{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]),
                ),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: Some("sunny".into()),
                tool_call_id: Some("c1".into()),
                ..ChatMessage::default()
            },
        ];
        let got = smollm2().render(&messages, None, true).unwrap();
        assert!(got.contains("<|im_start|>assistant\n{\"tool_calls\":[{\"name\":\"weather\",\"arguments\":{},\"id\":\"c1\"}]}<|im_end|>"), "{got}");
        assert!(got.ends_with("<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n"), "{got}");
    }

    #[test]
    fn what_a_template_still_refuses_is_a_template_error() {
        let alternating = "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}\
            {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
            {{ m.content }}{% endfor %}";
        let template = ChatTemplate::new(alternating, "<s>", "</s>").unwrap();
        let err =
            template.render(&[ChatMessage::new("user", "x"), ChatMessage::new("user", "y")], None, false).unwrap_err();
        assert!(matches!(err, Error::Template { .. }), "{err}");
        assert!(err.to_string().contains("Conversation roles must alternate"), "{err}");
        assert_eq!(template.render(&[ChatMessage::new("user", "ok")], None, false).unwrap(), "ok");

        let err = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(matches!(err, Error::Template { .. }), "{err}");
    }
}
