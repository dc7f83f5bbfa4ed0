//! The firewall against a leaky upstream that also echoes: four tenants paste configs and
//! notes (their secrets included), then a replay of answers in which about a quarter quote
//! the asking tenant's own earlier prompt and secrets back to it, a fifth splice in another
//! tenant's text or secret — plainly or disguised (Cyrillic homoglyphs, full-width forms,
//! zero-width characters, upper case, a secret cut off at 60 % or more) — and the rest are
//! fresh prose. Streamed and not, alternately.
//!
//! Asserted from what the clients received:
//! - no foreign payload reaches a client: a spliced fragment never shows more than its
//!   first 3 words, a foreign secret none of its characters;
//! - at most 0.5 % of the clean answers (fresh prose and own echoes) are blocked, and own
//!   secrets come back intact.
//!
//! The figures (answers of each kind, blocked, leaked) are printed; the test fails on the
//! goals.

use std::time::Duration;

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{sse_data, TestGateway, VOCAB};
use serde_json::{json, Value};

const TENANTS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];
/// Answers per tenant in the replay.
const ROUNDS: usize = 100;

/// A deterministic generator (xorshift), so every run replays the same traffic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn sentence(&mut self, n: usize) -> String {
        let vocab: Vec<&str> = VOCAB.split_whitespace().collect();
        (0..n).map(|_| vocab[self.below(vocab.len())]).collect::<Vec<_>>().join(" ")
    }

    fn chars(&mut self, alphabet: &str, n: usize) -> String {
        let a: Vec<char> = alphabet.chars().collect();
        (0..n).map(|_| a[self.below(a.len())]).collect()
    }
}

const ALNUM: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// One tenant's secrets, each in a form the built-in rules know.
fn secrets_of(rng: &mut Rng) -> Vec<String> {
    vec![
        format!("ghp_{}", rng.chars(ALNUM, 36)),
        format!("AKIA{}", rng.chars("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)),
        format!("sk_live_{}", rng.chars(ALNUM, 24)),
        format!("postgres://app:{}@db.internal:5432/prod", rng.chars(ALNUM, 20)),
    ]
}

/// Where the secret value starts inside a secret string (the password of a URL).
fn secret_value(secret: &str) -> &str {
    match secret.strip_prefix("postgres://app:") {
        Some(rest) => rest.split('@').next().unwrap_or(rest),
        None => secret,
    }
}

/// The disguises an adversarial upstream applies to a foreign payload.
#[derive(Debug, Clone, Copy)]
enum Disguise {
    Plain,
    Homoglyph,
    FullWidth,
    ZeroWidth,
    Upper,
}

const DISGUISES: [Disguise; 5] =
    [Disguise::Plain, Disguise::Homoglyph, Disguise::FullWidth, Disguise::ZeroWidth, Disguise::Upper];

fn disguise(text: &str, how: Disguise) -> String {
    match how {
        Disguise::Plain => text.to_owned(),
        Disguise::Homoglyph => text
            .chars()
            .map(|c| match c {
                'a' => 'а',
                'e' => 'е',
                'o' => 'о',
                'p' => 'р',
                'c' => 'с',
                'x' => 'х',
                'y' => 'у',
                'A' => 'А',
                'E' => 'Е',
                'O' => 'О',
                'K' => 'К',
                _ => c,
            })
            .collect(),
        Disguise::FullWidth => text
            .chars()
            .map(|c| if c.is_ascii_graphic() { char::from_u32(c as u32 - 0x21 + 0xFF01).unwrap_or(c) } else { c })
            .collect(),
        Disguise::ZeroWidth => text.chars().flat_map(|c| [c, '\u{200B}']).collect(),
        // Secrets keep their case (a lower-cased token is another token); text does not.
        Disguise::Upper => text.to_uppercase(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Clean,
    OwnEcho,
    ForeignText,
    ForeignSecret,
}

/// One scripted answer and what it hides.
struct Answer {
    kind: Kind,
    text: String,
    /// Byte offset where the foreign payload starts, and how many of its words may show.
    payload: Option<(usize, usize)>,
    /// Own secrets the answer quotes (must come back intact).
    own_secrets: Vec<String>,
    /// How the payload was made, for the report.
    how: String,
    /// Whose payload it is.
    victim: Option<&'static str>,
}

struct Tenant {
    name: &'static str,
    prompts: Vec<String>,
    secrets: Vec<String>,
}

/// 10 to 24 consecutive words of `prompt`.
fn fragment(prompt: &str, rng: &mut Rng) -> String {
    let words: Vec<&str> = prompt.split_whitespace().collect();
    let count = 10 + rng.below(15);
    let from = rng.below(words.len().saturating_sub(count).max(1));
    words[from..(from + count).min(words.len())].join(" ")
}

fn script(asker: &Tenant, others: &[&Tenant], rng: &mut Rng, round: usize) -> Answer {
    let intro = format!("Sure. {}. ", rng.sentence(12));
    let outro = format!(" {}.", rng.sentence(10));
    let roll = rng.below(100);
    if roll < 25 {
        let secret = asker.secrets[rng.below(asker.secrets.len())].clone();
        let quote = fragment(&asker.prompts[rng.below(asker.prompts.len())], rng);
        let text =
            format!("{intro}You wrote: \"{quote}\". The value you pasted is {secret} and it looks valid.{outro}");
        return Answer {
            kind: Kind::OwnEcho,
            text,
            payload: None,
            own_secrets: vec![secret_value(&secret).to_owned()],
            how: String::new(),
            victim: None,
        };
    }
    if roll < 45 {
        let victim = others[rng.below(others.len())];
        let how = DISGUISES[round % DISGUISES.len()];
        if rng.below(2) == 0 {
            // The notes (the settings paste holds the secrets, tried below).
            let frag = disguise(&fragment(&victim.prompts[1 + rng.below(victim.prompts.len() - 1)], rng), how);
            let text = format!("{intro}{frag}{outro}");
            // At most the first 3 words of the fragment may reach the client.
            return Answer {
                kind: Kind::ForeignText,
                payload: Some((intro.len(), 3)),
                text,
                own_secrets: Vec::new(),
                how: format!("{how:?}"),
                victim: Some(victim.name),
            };
        }
        let secret = &victim.secrets[rng.below(victim.secrets.len())];
        let how = if matches!(how, Disguise::Upper) { Disguise::Plain } else { how };
        let shown = match round % 3 {
            // A token cut off at 60-90 % of its length (the URL keeps its host).
            0 if !secret.starts_with("postgres") => secret[..secret.len() * (6 + rng.below(4)) / 10].to_owned(),
            _ => secret.clone(),
        };
        let cut = if shown.len() < secret.len() {
            format!(" cut at {}/{}", shown.len(), secret.len())
        } else {
            String::new()
        };
        let kind = format!("{how:?} {}{cut}", &secret[..4]);
        let shown = disguise(&shown, how);
        let text = format!("{intro}Try {shown}{outro}");
        let at = intro.len() + "Try ".len();
        return Answer {
            kind: Kind::ForeignSecret,
            payload: Some((at, 0)),
            text,
            own_secrets: Vec::new(),
            how: kind,
            victim: Some(victim.name),
        };
    }
    Answer {
        kind: Kind::Clean,
        text: format!("{intro}{}{outro}", rng.sentence(25)),
        payload: None,
        own_secrets: Vec::new(),
        how: String::new(),
        victim: None,
    }
}

const ADMIN: &str = "admin-token-0123456789";

fn config(base_url: &str) -> String {
    let mut text = format!("admin_token = \"{ADMIN}\"\n");
    for t in TENANTS {
        text.push_str(&format!("[[tenants]]\nid = \"{t}\"\napi_keys = [\"sk-{t}-key\"]\n"));
    }
    text.push_str(&format!("[[models]]\nid = \"mock\"\nbackend = \"upstream\"\nbase_url = \"{base_url}\"\n"));
    text
}

/// Words (with a letter or digit) of `text` from byte `at` on, invisible characters ignored.
fn words_from(text: &str, at: usize) -> usize {
    let tail = String::from_utf8_lossy(text.as_bytes().get(at..).unwrap_or_default()).into_owned();
    tail.split_whitespace().filter(|w| w.chars().any(char::is_alphanumeric)).count()
}

/// What one client received: text, finish reason and the audit id header.
struct Delivered {
    text: String,
    finish: String,
    audit_id: Option<String>,
}

/// The source tenants of an audit record (a stream's record is written just after it ends).
async fn audit_sources(gw: &TestGateway, id: &str) -> Vec<String> {
    for _ in 0..200 {
        let resp = reqwest::Client::new()
            .get(gw.url(&format!("/admin/api/audit/{id}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("admin api");
        if resp.status() == 200 {
            let record: Value = resp.json().await.expect("record");
            let findings = record["findings"].as_array().cloned().unwrap_or_default();
            return findings
                .iter()
                .flat_map(|f| f["source_tenants"].as_array().cloned().unwrap_or_default())
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no audit record {id}");
}

async fn ask(gw: &TestGateway, tenant: &str, messages: Value, stream: bool) -> Delivered {
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(format!("sk-{tenant}-key"))
        .timeout(Duration::from_secs(30))
        .json(&json!({"model": "mock", "stream": stream, "messages": messages}))
        .send()
        .await
        .expect("gateway answers");
    assert_eq!(resp.status(), 200);
    let audit_id = resp.headers().get("x-crossguard-audit-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    if stream {
        let frames = sse_data(&resp.text().await.expect("body"));
        let chunks: Vec<Value> =
            frames.iter().filter(|f| *f != "[DONE]").filter_map(|f| serde_json::from_str(f).ok()).collect();
        let text = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        let finish =
            chunks.iter().rev().find_map(|c| c["choices"][0]["finish_reason"].as_str()).unwrap_or("").to_owned();
        Delivered { text, finish, audit_id }
    } else {
        let v: Value = resp.json().await.expect("json");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("").to_owned();
        Delivered { text, finish: v["choices"][0]["finish_reason"].as_str().unwrap_or("").to_owned(), audit_id }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoes_flow_and_no_foreign_payload_leaks_in_any_disguise() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url()), &[]).await;
    let mut rng = Rng(0x5EED_CAFE_F00D_0001);
    let noted = mock.can("Noted, I have your notes and settings.");

    // Each tenant pastes its settings and two notes.
    let mut tenants = Vec::new();
    for name in TENANTS {
        let secrets = secrets_of(&mut rng);
        let prompts = vec![
            format!(
                "what is wrong with my settings {} GITHUB_TOKEN={} AWS_ACCESS_KEY_ID={} STRIPE_KEY={} DATABASE_URL={} {}",
                rng.sentence(12),
                secrets[0],
                secrets[1],
                secrets[2],
                secrets[3],
                rng.sentence(12)
            ),
            rng.sentence(40),
            rng.sentence(40),
        ];
        for p in &prompts {
            let messages = json!([{"role": "user", "content": p}, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": format!("#canned {noted}")}]);
            assert_eq!(ask(&gw, name, messages, false).await.finish, "stop");
        }
        tenants.push(Tenant { name, prompts, secrets });
    }

    let (mut clean, mut clean_blocked, mut leaked, mut foreign, mut foreign_blocked) =
        (0usize, Vec::new(), Vec::new(), 0usize, 0usize);
    for round in 0..ROUNDS {
        for (i, asker) in tenants.iter().enumerate() {
            let others: Vec<&Tenant> = tenants.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, t)| t).collect();
            let answer = script(asker, &others, &mut rng, round);
            let k = mock.can(answer.text.clone());
            let stream = (round + i) % 2 == 0;
            let Delivered { text, finish, audit_id } =
                ask(&gw, asker.name, json!([{"role": "user", "content": format!("#canned {k}")}]), stream).await;
            let label = format!("{:?} ({}) round {round} {} stream={stream}", answer.kind, answer.how, asker.name);
            match answer.payload {
                None => {
                    clean += 1;
                    if finish != "stop" || text != answer.text {
                        clean_blocked.push(format!("{label}: finish {finish}"));
                    }
                    for s in &answer.own_secrets {
                        assert!(finish != "stop" || text.contains(s.as_str()), "{label}: own secret altered");
                    }
                }
                Some((at, allowed)) => {
                    foreign += 1;
                    if finish == "content_filter" {
                        foreign_blocked += 1;
                        // The audit record names whose data it was.
                        let id = audit_id.as_deref().expect("a blocked response names its audit record");
                        let sources = audit_sources(&gw, id).await;
                        assert!(
                            answer.victim.is_some_and(|v| sources.iter().any(|s| s == v)),
                            "{label}: sources {sources:?}"
                        );
                    }
                    let shown = words_from(&text, at);
                    if shown > allowed {
                        leaked.push(format!(
                            "{label}: {shown} words of the payload delivered (allowed {allowed}), finish {finish}"
                        ));
                    }
                }
            }
        }
    }
    println!(
        "replay: {clean} clean answers (fresh and own echoes), {} blocked; {foreign} foreign payloads, {foreign_blocked} blocked, {} leaked",
        clean_blocked.len(),
        leaked.len()
    );
    assert!(leaked.is_empty(), "foreign payloads reached clients:\n{}", leaked.join("\n"));
    assert!(
        clean_blocked.len() * 200 <= clean,
        "clean answers blocked ({} of {clean}):\n{}",
        clean_blocked.len(),
        clean_blocked.join("\n")
    );
    assert!(
        clean >= 100 && foreign >= 30,
        "the replay must hold enough of both kinds: {clean} clean, {foreign} foreign"
    );
}
