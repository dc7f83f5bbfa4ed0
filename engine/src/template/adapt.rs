//! What a chat template can render, and the rewrites that carry any OpenAI conversation
//! through one that cannot.
//!
//! Clients send conversations as OpenAI defines them: `developer` turns, assistant turns
//! whose `content` is `null` beside their `tool_calls`, `tool` turns with results. Most
//! templates were written for less — SmolLM2's concatenates `content` as a string and
//! shows no tool calls, Gemma's refuses a `system` turn — and a template engine's error
//! ("tried to use + operator on unsupported types string and none") tells a client
//! nothing. So each template is probed once at load, by rendering small conversations
//! with marker strings and looking for the markers in the output ([`Abilities::probe`]),
//! and every conversation is rewritten into the subset the template shows
//! ([`Abilities::adapt`]): what it cannot show is written into message text, in a form
//! the model can read, rather than dropped.
//!
//! Tool calls a template cannot show become the assistant turn's text as
//! `{"tool_calls": [{"name": …, "arguments": {…}, "id": …}]}`, and tool results a user
//! turn `{"tool_response": {"tool_call_id": …, "content": …}}`: the same shapes the
//! engine asks such a model to answer in when it is given tools.

use serde_json::{json, Value};

use super::ChatMessage;
use crate::Result;

const SYSTEM_MARK: &str = "xq-probe-system-7d1";
const TOOL_NAME_MARK: &str = "xq_probe_tool_4b2";
const TOOL_RESULT_MARK: &str = "xq-probe-result-9e5";

/// What one template shows of a conversation, as found by `Abilities::probe`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Abilities {
    /// A `system` turn's text reaches the prompt (Gemma 2's template refuses the role).
    pub system_role: bool,
    /// The template names the `developer` role itself (OpenAI's newer templates); else
    /// a developer turn is rendered as a system turn.
    pub developer_role: bool,
    /// An assistant turn whose content is `none` renders.
    pub none_content: bool,
    /// An assistant turn's `tool_calls` reach the prompt.
    pub tool_calls: bool,
    /// Those calls' `arguments` must be objects (the template applies `tojson` to them);
    /// OpenAI sends them as JSON text.
    pub object_arguments: bool,
    /// A `tool` turn's content reaches the prompt.
    pub tool_role: bool,
    /// The `tools` list reaches the prompt.
    pub tools: bool,
}

impl Abilities {
    /// Probes `render` (the template, verbatim, without a generation prompt) with
    /// conversations that use one feature each. `source` is the template's text.
    pub(super) fn probe(source: &str, render: impl Fn(&[ChatMessage], Option<&Value>) -> Result<String>) -> Abilities {
        let shows = |messages: &[ChatMessage], tools: Option<&Value>, mark: &str| {
            render(messages, tools).is_ok_and(|out| out.contains(mark))
        };
        let user = ChatMessage::new("user", "hello");
        let system_role = shows(&[ChatMessage::new("system", SYSTEM_MARK), user.clone()], None, SYSTEM_MARK);
        // `none` must render as nothing: minijinja, like Jinja2, prints it as "none".
        let answer = |content: Option<String>| {
            [user.clone(), ChatMessage { role: "assistant".into(), content, ..ChatMessage::default() }]
        };
        let none_content = render(&answer(None), None)
            .is_ok_and(|out| render(&answer(Some(String::new())), None).is_ok_and(|empty| empty == out));
        let empty = if none_content { None } else { Some(String::new()) };
        let call = |arguments: Value| ChatMessage {
            role: "assistant".into(),
            content: empty.clone(),
            tool_calls: Some(
                json!([{"id": "call_probe", "type": "function", "function": {"name": TOOL_NAME_MARK, "arguments": arguments}}]),
            ),
            ..ChatMessage::default()
        };
        // Arguments must come out as the JSON the model saw, not JSON text quoted again.
        let arguments_shown = |arguments: Value| {
            render(&[user.clone(), call(arguments)], None)
                .is_ok_and(|out| out.contains(TOOL_NAME_MARK) && out.contains(r#"{"probe_arg": 1}"#))
        };
        let text_arguments = arguments_shown(Value::String(r#"{"probe_arg": 1}"#.into()));
        let object_arguments = !text_arguments && arguments_shown(json!({"probe_arg": 1}));
        let tool_calls = text_arguments || object_arguments;
        let abilities = Abilities {
            system_role,
            developer_role: source.contains("developer"),
            none_content,
            tool_calls,
            object_arguments,
            tool_role: false,
            tools: false,
        };
        // The tool turn is probed after a call written the way this template needs it.
        let result = ChatMessage {
            role: "tool".into(),
            content: Some(TOOL_RESULT_MARK.into()),
            tool_call_id: Some("call_probe".into()),
            ..ChatMessage::default()
        };
        let exchange = abilities.adapt(&[user.clone(), call(Value::String(r#"{"probe_arg": 1}"#.into()))]);
        let mut with_result = exchange.clone();
        with_result.push(result);
        let tool_role = shows(&with_result, None, TOOL_RESULT_MARK);
        let tools = json!([{"type": "function", "function": {"name": TOOL_NAME_MARK, "description": "probe", "parameters": {"type": "object", "properties": {}}}}]);
        let tools = shows(std::slice::from_ref(&user), Some(&tools), TOOL_NAME_MARK);
        Abilities { tool_role, tools, ..abilities }
    }

    /// `messages` rewritten into what the template shows (see the module docs).
    pub fn adapt(&self, messages: &[ChatMessage]) -> Vec<ChatMessage> {
        let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
        // System text waiting for the next user turn, for templates without the role.
        let mut pending_system: Option<String> = None;
        for m in messages {
            let mut m = m.clone();
            if m.role == "developer" && !self.developer_role {
                m.role = "system".into();
            }
            if m.role == "tool" && !self.tool_role {
                m = tool_result_as_user(&m);
            }
            if m.role == "system" && !self.system_role {
                let text = m.content.unwrap_or_default();
                pending_system = Some(match pending_system {
                    Some(before) => format!("{before}\n\n{text}"),
                    None => text,
                });
                continue;
            }
            if m.role == "user" {
                if let Some(system) = pending_system.take() {
                    m.content = Some(match m.content {
                        Some(text) if !text.is_empty() => format!("{system}\n\n{text}"),
                        _ => system,
                    });
                }
            }
            if let Some(calls) = m.tool_calls.take().filter(|c| !c.is_null()) {
                if self.tool_calls {
                    m.tool_calls = Some(if self.object_arguments { with_object_arguments(&calls) } else { calls });
                } else {
                    m.content = Some(join_text(m.content.take(), &tool_calls_text(&calls)));
                }
            }
            if m.content.is_none() && !self.none_content {
                m.content = Some(String::new());
            }
            out.push(m);
        }
        if let Some(system) = pending_system {
            out.push(ChatMessage::new("user", &system));
        }
        out
    }
}

/// `before` and `after` on separate lines (just `after` when there is nothing before).
fn join_text(before: Option<String>, after: &str) -> String {
    match before {
        Some(text) if !text.is_empty() => format!("{text}\n{after}"),
        _ => after.to_owned(),
    }
}

/// OpenAI's `arguments` is JSON text; as an object when it parses as one.
fn parsed_arguments(arguments: Option<&Value>) -> Value {
    match arguments {
        Some(Value::String(text)) => serde_json::from_str::<Value>(text)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::String(text.clone())),
        Some(other) => other.clone(),
        None => json!({}),
    }
}

fn with_object_arguments(calls: &Value) -> Value {
    let mut calls = calls.clone();
    for call in calls.as_array_mut().into_iter().flatten() {
        if let Some(function) = call.get_mut("function").and_then(Value::as_object_mut) {
            let arguments = parsed_arguments(function.get("arguments"));
            function.insert("arguments".into(), arguments);
        }
    }
    calls
}

/// `{"tool_calls": [{"name", "arguments", "id"}]}`, compact, for a template that shows
/// no tool calls.
fn tool_calls_text(calls: &Value) -> String {
    let calls: Vec<Value> = calls
        .as_array()
        .into_iter()
        .flatten()
        .map(|call| {
            let function = call.get("function");
            let mut entry = serde_json::Map::new();
            entry.insert("name".into(), function.and_then(|f| f.get("name")).cloned().unwrap_or(Value::Null));
            entry.insert("arguments".into(), parsed_arguments(function.and_then(|f| f.get("arguments"))));
            if let Some(id) = call.get("id").filter(|id| id.is_string()) {
                entry.insert("id".into(), id.clone());
            }
            Value::Object(entry)
        })
        .collect();
    json!({ "tool_calls": calls }).to_string()
}

/// A `tool` turn as a user turn: `{"tool_response": {"tool_call_id", "name"?, "content"}}`.
fn tool_result_as_user(m: &ChatMessage) -> ChatMessage {
    let mut response = serde_json::Map::new();
    if let Some(id) = &m.tool_call_id {
        response.insert("tool_call_id".into(), Value::String(id.clone()));
    }
    if let Some(name) = &m.name {
        response.insert("name".into(), Value::String(name.clone()));
    }
    response.insert("content".into(), Value::String(m.content.clone().unwrap_or_default()));
    ChatMessage::new("user", &json!({ "tool_response": response }).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::ChatTemplate;

    fn call(name: &str, arguments: &str) -> ChatMessage {
        ChatMessage {
            role: "assistant".into(),
            tool_calls: Some(
                json!([{"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}]),
            ),
            ..ChatMessage::default()
        }
    }

    fn result(content: &str) -> ChatMessage {
        ChatMessage {
            role: "tool".into(),
            content: Some(content.into()),
            tool_call_id: Some("call_1".into()),
            ..ChatMessage::default()
        }
    }

    /// ChatML that concatenates content as a string and knows nothing of tools, like
    /// SmolLM2's.
    const PLAIN_CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";

    /// A Hermes-style template (Qwen 2.5's shape): tool calls with `tojson` arguments,
    /// tool results wrapped in `<tool_response>`, tools listed in the system turn.
    const HERMES: &str = "{% if tools %}<tools>{% for t in tools %}{{ t.function | tojson }}{% endfor %}</tools>\n{% endif %}\
        {% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n\
        {% else %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}\
        {% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endif %}{% endfor %}";

    /// Gemma's rule: user and assistant turns only.
    const NO_SYSTEM: &str = "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('Conversation roles must be user or assistant') }}{% endif %}\
        <start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}";

    #[test]
    fn a_plain_template_gets_tool_calls_and_results_as_text() {
        let t = ChatTemplate::new(PLAIN_CHATML, "", "").unwrap();
        let a = t.abilities();
        assert!(a.system_role && !a.none_content && !a.tool_calls && !a.tools, "{a:?}");
        // A tool turn renders verbatim as its own role in ChatML: shown, so kept.
        assert!(a.tool_role, "{a:?}");
        let messages = [
            ChatMessage::new("developer", "be brief"),
            ChatMessage::new("user", "weather in Paris?"),
            call("get_weather", r#"{"city":"Paris"}"#),
            result("sunny, 21 C"),
        ];
        let got = t.render(&messages, None, false).unwrap();
        assert_eq!(
            got,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nweather in Paris?<|im_end|>\n\
             <|im_start|>assistant\n{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"},\"id\":\"call_1\"}]}<|im_end|>\n\
             <|im_start|>tool\nsunny, 21 C<|im_end|>\n"
        );
        // An assistant turn with neither content nor calls renders as empty text.
        let empty = ChatMessage { role: "assistant".into(), ..ChatMessage::default() };
        assert!(t
            .render(&[ChatMessage::new("user", "x"), empty], None, false)
            .unwrap()
            .contains("assistant\n<|im_end|>"));
    }

    #[test]
    fn a_tool_aware_template_gets_the_calls_natively_with_object_arguments() {
        let t = ChatTemplate::new(HERMES, "", "").unwrap();
        let a = t.abilities();
        assert!(a.tool_calls && a.object_arguments && a.tool_role && a.tools && a.none_content, "{a:?}");
        let got = t
            .render(
                &[ChatMessage::new("user", "weather?"), call("get_weather", r#"{"city": "Paris"}"#), result("sunny")],
                None,
                false,
            )
            .unwrap();
        assert!(
            got.contains(
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
            ),
            "{got}"
        );
        assert!(got.contains("<tool_response>\nsunny\n</tool_response>"), "{got}");
    }

    #[test]
    fn system_text_moves_into_the_next_user_turn_when_the_role_is_refused() {
        let t = ChatTemplate::new(NO_SYSTEM, "", "").unwrap();
        assert!(!t.abilities().system_role);
        let got =
            t.render(&[ChatMessage::new("system", "be brief"), ChatMessage::new("user", "hi")], None, false).unwrap();
        assert_eq!(got, "<start_of_turn>user\nbe brief\n\nhi<end_of_turn>\n");
        // A tool result becomes a user turn the model can read.
        let got = t.render(&[ChatMessage::new("user", "q"), call("f", "{}"), result("42")], None, false).unwrap();
        assert!(
            got.contains("<start_of_turn>user\n{\"tool_response\":{\"tool_call_id\":\"call_1\",\"content\":\"42\"}}"),
            "{got}"
        );
    }

    #[test]
    fn arguments_that_are_not_an_object_stay_text() {
        assert_eq!(parsed_arguments(Some(&json!("not json"))), json!("not json"));
        assert_eq!(parsed_arguments(Some(&json!("[1]"))), json!("[1]"));
        assert_eq!(parsed_arguments(None), json!({}));
    }
}
