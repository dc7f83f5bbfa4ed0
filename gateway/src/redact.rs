//! What of a secret or of outside text may be shown: one place that decides, used by
//! `check-config`'s summary, the config's `Debug`, and every log line that mentions text a
//! client or an upstream chose.
//!
//! - Secrets (tokens, keys, passwords) are [`MASK`], whole: no prefix, no length.
//! - URLs keep scheme, host, port and path; a password in them and the whole query
//!   string become [`MASK`] ([`url`]).
//! - Outside text (a prompt, a model name from a request, an upstream's error message)
//!   becomes its length and a short keyed hash ([`text`]): two log lines about the same
//!   text can be matched, the text cannot be read back or confirmed by guessing, because
//!   the hash key is drawn at random per process and never leaves it.
//! - Identifiers a client chose (request ids) pass only when they are short and made of
//!   `[A-Za-z0-9._:-]` and brackets ([`identifier`]), which cannot carry a line break,
//!   markup or prose.

use std::fmt;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// What a secret is shown as.
pub const MASK: &str = "***";

/// Longest client-chosen identifier shown as it is.
pub const MAX_IDENTIFIER_CHARS: usize = 64;

/// Outside text as `[N bytes #hash]`; see the module docs.
#[derive(Clone, Copy)]
pub struct Redacted<'a>(&'a str);

/// `text` as its length and keyed hash, for a log line.
pub fn text(text: &str) -> Redacted<'_> {
    Redacted(text)
}

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digest = Sha256::new().chain_update(process_key()).chain_update(self.0.as_bytes()).finalize();
        write!(f, "[{} bytes #{}]", self.0.len(), hex::encode(&digest[..4]))
    }
}

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The hash key of this process: 122 random bits from the uuid crate's secure generator.
fn process_key() -> &'static [u8; 16] {
    static KEY: OnceLock<[u8; 16]> = OnceLock::new();
    KEY.get_or_init(|| uuid::Uuid::new_v4().into_bytes())
}

/// Whether `text` is a plain identifier a log may show as it is.
pub fn is_identifier(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_IDENTIFIER_CHARS
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-' | b'[' | b']'))
}

/// A client-chosen identifier for a log line: itself when [`is_identifier`], else [`text`].
pub fn identifier(id: &str) -> String {
    if is_identifier(id) {
        id.to_owned()
    } else {
        text(id).to_string()
    }
}

/// `raw` with any password and the query string masked (`redis://:***@host:6379/0`); a
/// value that does not parse as a URL is masked whole (it could be anything).
pub fn url(raw: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(raw) else {
        return MASK.to_owned();
    };
    if parsed.password().is_some() && parsed.set_password(Some(MASK)).is_err() {
        return MASK.to_owned();
    }
    if parsed.query().is_some() {
        parsed.set_query(Some(MASK));
    }
    if parsed.fragment().is_some() {
        parsed.set_fragment(Some(MASK));
    }
    parsed.to_string()
}

/// `Some(secret)` as `***`, `None` as `unset`: whether a secret is configured, nothing more.
pub fn presence<T>(secret: Option<&T>) -> &'static str {
    match secret {
        Some(_) => MASK,
        None => "unset",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_shows_length_and_a_stable_hash_never_the_text() {
        let shown = text("the launch code is ORCHID-7741").to_string();
        assert!(!shown.contains("ORCHID") && !shown.contains("launch"), "{shown}");
        assert!(shown.starts_with("[30 bytes #") && shown.len() == "[30 bytes #01234567]".len(), "{shown}");
        assert_eq!(shown, text("the launch code is ORCHID-7741").to_string(), "same text, same hash");
        assert_ne!(shown, text("the launch code is ORCHID-7742").to_string());
    }

    #[test]
    fn only_short_plain_identifiers_pass() {
        assert_eq!(identifier("req_0191-abc:1.2"), "req_0191-abc:1.2");
        assert_eq!(identifier("messages[0].role"), "messages[0].role");
        for bad in ["a b", "x\ny", "<script>", "", &"a".repeat(65), "ünïcode", "{\"k\":1}"] {
            let shown = identifier(bad);
            assert!(shown.starts_with('[') && (bad.is_empty() || !shown.contains(bad)), "{bad:?}: {shown}");
        }
    }

    #[test]
    fn urls_lose_passwords_and_queries() {
        assert_eq!(url("redis://:hunter2-pass@127.0.0.1:6379/0"), "redis://:***@127.0.0.1:6379/0");
        assert_eq!(url("rediss://user:hunter2-pass@cache.internal:6380"), "rediss://user:***@cache.internal:6380");
        assert_eq!(url("https://api.internal/v1?api-key=hunter2-pass#t"), "https://api.internal/v1?***#***");
        assert_eq!(url("http://127.0.0.1:9000/v1"), "http://127.0.0.1:9000/v1");
        assert_eq!(url("not a url hunter2-pass"), MASK);
        assert_eq!((presence(Some(&1)), presence::<u8>(None)), ("***", "unset"));
    }
}
