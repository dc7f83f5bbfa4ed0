//! `rules test`: every rule's `must_match` and `must_not_match` samples, scanned the way
//! one-shot scanning goes, with each failure's file and line.

use crate::rules::ruleset::{LoadError, Ruleset};

impl Ruleset {
    /// Runs every rule's samples and reports per rule.
    pub fn run_samples(&self) -> SampleReport {
        let rules = self
            .rules
            .iter()
            .zip(&self.origins)
            .enumerate()
            .map(|(i, (rule, origin))| {
                let mut failures = Vec::new();
                let count = |text: &str| self.rule_finding_count(i, text);
                for (k, s) in rule.must_match.iter().enumerate() {
                    if count(s) == 0 {
                        let line = origin.must_match_lines.get(k).copied().unwrap_or(origin.line);
                        failures.push(SampleFailure {
                            line,
                            index: k + 1,
                            sample: s.clone(),
                            expect_match: true,
                            found: 0,
                        });
                    }
                }
                for (k, s) in rule.must_not_match.iter().enumerate() {
                    let found = count(s);
                    if found > 0 {
                        let line = origin.must_not_match_lines.get(k).copied().unwrap_or(origin.line);
                        failures.push(SampleFailure {
                            line,
                            index: k + 1,
                            sample: s.clone(),
                            expect_match: false,
                            found,
                        });
                    }
                }
                let total = rule.must_match.len() + rule.must_not_match.len();
                RuleSamples {
                    rule_id: rule.id.clone(),
                    file: origin.file.clone(),
                    line: origin.line,
                    passed: total - failures.len(),
                    failures,
                }
            })
            .collect();
        SampleReport { rules }
    }
}

/// Per-rule outcome of `rules test`.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleReport {
    pub rules: Vec<RuleSamples>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RuleSamples {
    pub rule_id: String,
    pub file: String,
    pub line: usize,
    pub passed: usize,
    pub failures: Vec<SampleFailure>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SampleFailure {
    pub line: usize,
    /// 1-based position in its list.
    pub index: usize,
    pub sample: String,
    /// true: a `must_match` sample that found nothing; false: a `must_not_match` that matched.
    pub expect_match: bool,
    pub found: usize,
}

impl SampleFailure {
    pub fn reason(&self) -> String {
        if self.expect_match {
            format!("must_match sample {} found nothing: {:?}", self.index, self.sample)
        } else {
            format!("must_not_match sample {} matched ({} finding(s)): {:?}", self.index, self.found, self.sample)
        }
    }
}

impl SampleReport {
    pub fn failed(&self) -> usize {
        self.rules.iter().map(|r| r.failures.len()).sum()
    }

    pub fn passed(&self) -> usize {
        self.rules.iter().map(|r| r.passed).sum()
    }

    /// The failures as loader errors (file:line, rule id, reason).
    pub fn into_errors(self) -> Vec<LoadError> {
        self.rules
            .into_iter()
            .flat_map(|r| {
                let (file, id) = (r.file, r.rule_id);
                r.failures.into_iter().map(move |f| LoadError {
                    file: file.clone(),
                    line: f.line,
                    rule_id: Some(id.clone()),
                    reason: f.reason(),
                })
            })
            .collect()
    }
}
