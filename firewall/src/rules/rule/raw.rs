//! A rule file's tables exactly as written: what `serde` reads from TOML and what the
//! gitleaks import writes.

use serde::{Deserialize, Serialize};

use crate::verdict::{Action, Severity};

/// The actions a rule file may name (`allow` is not one of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    Block,
    Redact,
    Log,
}

impl From<RuleAction> for Action {
    fn from(a: RuleAction) -> Action {
        match a {
            RuleAction::Block => Action::Block,
            RuleAction::Redact => Action::Redact,
            RuleAction::Log => Action::Log,
        }
    }
}

/// `secret_group` is a capture index or a capture name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SecretGroup {
    Index(usize),
    Name(String),
}

/// A `[[rule]]` table exactly as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub id: String,
    pub description: String,
    pub severity: Severity,
    pub action: RuleAction,
    pub regex: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_group: Option<SecretGroup>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keywords: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_entropy: Option<f64>,
    /// The generic-secret judge's least score (0..1) for a match to count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<f64>,
    /// Names of `[allow_lists]` (defined once in any file of the folder) whose patterns join
    /// `allow`; the ruleset resolves them before the rule is compiled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_lists: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Names of `[allow_lists]` whose patterns join `allow_line`, resolved as
    /// `allow_lists` are: contexts that many rules share (an API description's example).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_line_lists: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_line: Vec<String>,
    /// Exempts a secret that repeats the user name written right before it
    /// (`kamailio:kamailiorw`), as `allow_line` exempts by the words around it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_repeated_user: bool,
    /// Names of `[allow_lists]` whose patterns join `allow_decoded`, resolved as
    /// `allow_lists` are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_decoded_lists: Vec<String>,
    /// Exemptions by what a base64 secret says: searched in its decoding.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_decoded: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default)]
    pub must_match: Vec<String>,
    #[serde(default)]
    pub must_not_match: Vec<String>,
}

/// A `[[canary]]` table exactly as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCanary {
    pub id: String,
    pub owner: String,
    pub strings: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Shortest canary string accepted: shorter ones would fire on ordinary text.
pub const MIN_CANARY_LEN: usize = 8;
