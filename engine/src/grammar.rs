//! Constrained decoding: output that must follow a grammar (a JSON Schema, any JSON
//! object, a Lark grammar) is produced by letting the sampler choose only among the
//! tokens that keep it inside the grammar, step by step. The model's own distribution
//! still decides between those tokens, so the output is what the model would write
//! given the format, and valid by construction rather than by luck.
//!
//! The grammars are compiled by `llguidance` (the engine the llama.cpp and vLLM servers
//! use for the same job) against a view of the vocabulary built once per engine, on the
//! first request that needs it (`Grammars`). A compiled grammar is a starting state;
//! every choice of a request runs its own copy (`Constraint`).
//!
//! JSON comes out in one canonical spacing — `{"a": 1, "b": [1, 2]}`, no newlines — so a
//! small model cannot wander into whitespace until its token budget runs out. Schema
//! keywords the compiler does not enforce are refused at compile time, never ignored
//! ([`Error::Grammar`] names them).

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// What a request's output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid under this schema (OpenAI's `json_schema`).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect (which embeds JSON Schemas as `%json`).
    Lark(String),
}

impl Grammar {
    fn to_top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(with_layout(&json!({"type": "object"}))),
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(with_layout(schema)),
            Grammar::Lark(source) => TopLevelGrammar::from_lark(source.clone()),
        }
    }
}

/// `schema` with the compiler's options: canonical spacing (`", "`, `": "`, no newlines),
/// unenforceable keywords refused. [`Grammar::JsonSchema`] applies it itself; a schema
/// embedded in a Lark grammar (`%json {…}`) needs it applied by whoever writes the grammar.
pub fn with_layout(schema: &Value) -> Value {
    let layout = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": false});
    match schema {
        Value::Object(map) => {
            let mut map = map.clone();
            map.insert("x-guidance".into(), layout);
            Value::Object(map)
        }
        // `true` / `false` and other non-objects: the compiler judges them as they are.
        other => other.clone(),
    }
}

/// A grammar compiled for one engine's vocabulary: the state every choice starts from.
#[derive(Clone)]
pub struct CompiledGrammar {
    grammar: Grammar,
    start: Matcher,
}

impl CompiledGrammar {
    /// The grammar this was compiled from.
    pub fn grammar(&self) -> &Grammar {
        &self.grammar
    }

    /// A fresh constraint for one choice.
    pub(crate) fn start(&self) -> Constraint {
        Constraint { matcher: self.start.clone() }
    }
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar").field("grammar", &self.grammar).finish_non_exhaustive()
    }
}

/// Two compiled grammars are the same when their sources are.
impl PartialEq for CompiledGrammar {
    fn eq(&self, other: &Self) -> bool {
        self.grammar == other.grammar
    }
}

/// The grammar state of one choice.
pub(crate) struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// The tokens that keep the output inside the grammar (an end-of-generation token
    /// among them once the output is complete).
    pub(crate) fn allowed(&mut self) -> Result<SimpleVob> {
        let mask = self.matcher.compute_mask().map_err(runtime_error)?;
        if mask.is_zero() {
            return Err(Error::Constraint { reason: "no token can continue the output".into() });
        }
        Ok(mask)
    }

    /// Advances past `id` (which [`Constraint::allowed`] allowed).
    pub(crate) fn accept(&mut self, id: u32) -> Result<()> {
        self.matcher.consume_token(id).map_err(runtime_error)
    }

    /// The output is complete and nothing may follow it.
    pub(crate) fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

fn runtime_error(e: impl std::fmt::Display) -> Error {
    Error::Constraint { reason: e.to_string() }
}

/// The engine's grammar compiler: llguidance's view of the vocabulary, built on first use
/// (a fraction of a second for a 49k vocabulary, and memory no plain request needs).
pub(crate) struct Grammars {
    factory: OnceLock<std::result::Result<ParserFactory, String>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("built", &self.factory.get().is_some()).finish()
    }
}

impl Grammars {
    pub(crate) fn new() -> Grammars {
        Grammars { factory: OnceLock::new() }
    }

    /// Compiles `grammar` for `tokenizer`'s vocabulary (the one this was first used with).
    pub(crate) fn compile(&self, tokenizer: &Tokenizer, grammar: &Grammar) -> Result<CompiledGrammar> {
        let factory = self
            .factory
            .get_or_init(|| factory_for(tokenizer))
            .as_ref()
            .map_err(|reason| Error::Constraint { reason: reason.clone() })?;
        let parser =
            factory.create_parser(grammar.to_top_level()).map_err(|e| Error::Grammar { reason: e.to_string() })?;
        let start = Matcher::new(Ok(parser));
        if let Some(reason) = start.get_error() {
            return Err(Error::Grammar { reason });
        }
        Ok(CompiledGrammar { grammar: grammar.clone(), start })
    }
}

/// The vocabulary as llguidance sees it: each token's bytes, control tokens marked with
/// the 0xFF prefix so no grammar text can match them, every end-of-generation id an EOS.
fn factory_for(tokenizer: &Tokenizer) -> std::result::Result<ParserFactory, String> {
    let vocab = tokenizer.vocab_size();
    let words: Vec<Vec<u8>> = (0..vocab as u32)
        .map(|id| {
            let bytes = tokenizer.token_bytes(id);
            if tokenizer.is_control(id) || tokenizer.is_eos(id) {
                let mut marked = Vec::with_capacity(bytes.len() + 1);
                marked.push(TokTrie::SPECIAL_TOKEN_MARKER);
                marked.extend_from_slice(&bytes);
                marked
            } else {
                bytes
            }
        })
        .collect();
    let eos = tokenizer.eos_ids();
    let first_eos = *eos.first().ok_or("the vocabulary has no end-of-generation token")?;
    let trie = TokTrie::from(&TokRxInfo::new(vocab as u32, first_eos), &words).with_eos_tokens(eos);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
    // Warnings and errors come back through the matcher; nothing is printed.
    factory.quiet();
    Ok(factory)
}
