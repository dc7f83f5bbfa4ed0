//! The protection pipeline end to end, against the production bug replayed by a leaky
//! upstream (`#splice`: fragments of an earlier request's prompt spliced into a later
//! answer, 10–30 words, streamed in 40 pieces).
//!
//! - One gateway: no 8-word run of another tenant's prompt, and no other tenant's secret,
//!   reaches any client; every leak is blocked with `content_filter`, carries
//!   `x-crossguard-audit-id`, and its audit record names the source tenant. A tenant's own
//!   text echoed back, text three tenants share, and fresh clean answers flow (false-block
//!   rate ≤ 1%).
//! - Two gateways sharing one real Redis: the prompt goes through one, the leak through
//!   the other.
//! - The embedded store across a gateway restart: audit records are still listed, and the
//!   provenance index is back.
//! - Redis stopped mid-run and restarted: serving goes on (degraded), no record is lost.

use std::collections::HashSet;
use std::time::Duration;

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::own_redis::{free_port, OwnRedis};
use crossguard_e2e::{sse_data, TestGateway, Words};
use serde_json::{json, Value};

const TENANTS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];
const ADMIN: &str = "admin-token-0123456789";
const FP_KEY: &str = "00112233445566778899aabbccddeeff";

fn secret_of(tenant: &str) -> String {
    // A GitHub-token-shaped secret, distinct per tenant (the built-in rules know the shape).
    let body: String = format!("{tenant}XkJ3pQ9zLm7Wc2Rt8Yv5Nb1Hd6Fg4Sa0Ue")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(36)
        .collect();
    format!("ghp_{body:0<36}")
}

/// Normalised words, as the firewall compares them.
fn norm_words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| w.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect::<String>())
        .filter(|w| !w.is_empty())
        .collect()
}

/// True if any run of 8 consecutive words of `fragment` appears in `delivered`.
fn carries_8_words_of(delivered: &str, fragment: &str) -> bool {
    let d = norm_words(delivered);
    let f = norm_words(fragment);
    let runs: HashSet<&[String]> = d.windows(8).collect();
    f.windows(8).any(|w| runs.contains(w))
}

fn config(base_url: &str, store: &str) -> String {
    let mut text = format!("admin_token = \"{ADMIN}\"\n");
    for t in TENANTS {
        text.push_str(&format!("[[tenants]]\nid = \"{t}\"\napi_keys = [\"sk-{t}-key\"]\n"));
    }
    text.push_str(&format!(
        "[[models]]\nid = \"mock\"\nbackend = \"upstream\"\nbase_url = \"{base_url}\"\n\
         [provenance]\nrefresh_interval_ms = 50\n{store}"
    ));
    text
}

/// What one client received.
struct Delivered {
    text: String,
    finish: String,
    audit_id: Option<String>,
}

async fn complete(gw: &TestGateway, tenant: &str, messages: Value, stream: bool) -> Delivered {
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(format!("sk-{tenant}-key"))
        .json(&json!({"model": "mock", "stream": stream, "messages": messages}))
        .send()
        .await
        .expect("gateway answers");
    assert_eq!(resp.status(), 200);
    let audit_id = resp.headers().get("x-crossguard-audit-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    if stream {
        let frames = sse_data(&resp.text().await.unwrap());
        assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = frames[..frames.len() - 1].iter().map(|f| serde_json::from_str(f).unwrap()).collect();
        let text = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        let finish =
            chunks.iter().rev().find_map(|c| c["choices"][0]["finish_reason"].as_str()).unwrap_or("").to_owned();
        Delivered { text, finish, audit_id }
    } else {
        let v: Value = resp.json().await.unwrap();
        let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("").to_owned();
        Delivered { text, finish: v["choices"][0]["finish_reason"].as_str().unwrap_or("").to_owned(), audit_id }
    }
}

/// Sends `prompt` as a tenant's first message (the upstream just acknowledges it).
async fn seed(gw: &TestGateway, tenant: &str, prompt: &str) {
    let messages = json!([{"role": "user", "content": prompt}, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "#leak Noted, thanks."}]);
    let d = complete(gw, tenant, messages, false).await;
    assert_eq!(d.finish, "stop");
}

async fn leak(gw: &TestGateway, tenant: &str, request: usize, from: usize, count: usize, stream: bool) -> Delivered {
    complete(gw, tenant, json!([{"role": "user", "content": format!("#splice {request} {from} {count}")}]), stream)
        .await
}

async fn admin_get(gw: &TestGateway, path: &str) -> Value {
    let resp = reqwest::Client::new().get(gw.url(path)).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.unwrap()
}

/// An audit record by id. A stream's record is written as the stream ends, just after the
/// client saw `[DONE]`, so this waits for it a little.
async fn audit_record(gw: &TestGateway, id: &str) -> Value {
    for _ in 0..200 {
        let resp = reqwest::Client::new()
            .get(gw.url(&format!("/admin/api/audit/{id}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        if resp.status() == 200 {
            return resp.json().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no audit record {id}");
}

/// The first user message of each seeded request, in the order the upstream got them.
struct Seeded {
    prompts: Vec<(String, String)>,
}

impl Seeded {
    /// Two distinctive prompts per tenant (one holding its secret), then a paragraph that
    /// acme, globex and initech all send (common text, not a leak when it comes back).
    async fn run(gw: &TestGateway, words: &mut Words, common: &str) -> Seeded {
        let mut prompts = Vec::new();
        for round in 0..2 {
            for t in TENANTS {
                let prompt = if round == 0 {
                    format!("{} my deploy token is {} {}", words.sentence(14), secret_of(t), words.sentence(30))
                } else {
                    words.sentence(45)
                };
                seed(gw, t, &prompt).await;
                prompts.push((t.to_owned(), prompt));
            }
        }
        for t in &TENANTS[..3] {
            seed(gw, t, common).await;
            prompts.push(((*t).to_owned(), common.to_owned()));
        }
        Seeded { prompts }
    }
}

#[tokio::test]
async fn a_leak_storm_delivers_no_foreign_fragment_and_ordinary_traffic_flows() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    let mut words = Words::new(7);
    let common = format!("Company policy reminder: {}", words.sentence(30));
    let seeded = Seeded::run(&gw, &mut words, &common).await;

    // The storm: every tenant receives fragments of every other tenant's prompts.
    let mut leaks = 0;
    for (j, (owner, prompt)) in seeded.prompts.iter().enumerate().take(8) {
        for (k, victim) in TENANTS.iter().filter(|t| *t != owner).enumerate() {
            let count = 10 + (j * 7 + k * 5) % 21;
            let total = prompt.split_whitespace().count();
            let from = (j * 3 + k * 11) % (total - count);
            let fragment: String = prompt.split_whitespace().skip(from).take(count).collect::<Vec<_>>().join(" ");
            let d = leak(&gw, victim, j, from, count, (j + k) % 2 == 0).await;
            assert!(!carries_8_words_of(&d.text, &fragment), "{victim} got 8+ words of {owner}'s prompt: {:?}", d.text);
            assert!(!d.text.contains(&secret_of(owner)[..8]), "{victim} got {owner}'s secret");
            assert_eq!(d.finish, "content_filter", "{victim} <- {owner}: {:?}", d.text);
            let id = d.audit_id.expect("a blocked response names its audit record");
            let record = audit_record(&gw, &id).await;
            assert_eq!(record["tenant"], *victim);
            assert_eq!(record["action"], "block");
            let sources: Vec<&str> =
                record["source_tenants"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
            let secret_rule = record["findings"].as_array().unwrap().iter().any(|f| f["rule_id"] != "foreign-ngram");
            assert!(sources.contains(&owner.as_str()) || secret_rule, "{record}");
            assert!(!record.to_string().contains(&fragment), "the audit log never holds the text");
            leaks += 1;
        }
    }
    assert_eq!(leaks, 24);

    // Ordinary traffic: own text echoed back, common text, and fresh answers.
    let mut clean = 0;
    let mut blocked = Vec::new();
    for (j, (owner, _)) in seeded.prompts.iter().enumerate().take(8) {
        let own = leak(&gw, owner, j, 20, 15, j % 2 == 0).await;
        clean += 1;
        if own.finish != "stop" {
            blocked.push(format!("{owner} own echo: {}", own.text));
        }
    }
    let common_request = seeded.prompts.len() - 1;
    let shared = leak(&gw, "umbrella", common_request, 3, 20, true).await;
    clean += 1;
    if shared.finish != "stop" {
        blocked.push(format!("common text: {}", shared.text));
    }
    for i in 0..100 {
        let t = TENANTS[i % 4];
        let text = format!("#leak Sure. {} Let me know.", words.sentence(25));
        let d = complete(&gw, t, json!([{"role": "user", "content": text}]), i % 2 == 0).await;
        clean += 1;
        if d.finish != "stop" {
            blocked.push(format!("{t} clean: {}", d.text));
        }
    }
    assert!(blocked.len() * 100 <= clean, "false blocks {} of {clean}: {blocked:#?}", blocked.len());

    let page = admin_get(&gw, "/admin/api/audit?limit=500").await;
    assert_eq!(page["records"].as_array().unwrap().len(), 24 + blocked.len());
    let for_acme = admin_get(&gw, "/admin/api/audit?tenant=acme&rule=foreign-ngram").await;
    assert!(for_acme["records"].as_array().unwrap().iter().all(|r| r["tenant"] == "acme"));
}

/// Has the model say `answer` (through the mock: the asker never sends it): globex gets a
/// `content_filter` answer, streamed and not, of which `leaked` finds nothing, and an audit
/// record naming acme as the source; acme gets `answer` back untouched. Returns globex's
/// audit records.
async fn blocked_for_globex_only(
    gw: &TestGateway,
    mock: &MockUpstream,
    answer: &str,
    leaked: impl Fn(&str) -> bool,
) -> Vec<Value> {
    let ask = json!([{"role": "user", "content": format!("#canned {}", mock.can(answer))}]);
    let mut records = Vec::new();
    for stream in [true, false] {
        let d = complete(gw, "globex", ask.clone(), stream).await;
        assert_eq!(d.finish, "content_filter", "stream {stream}: {:?}", d.text);
        assert!(!leaked(&d.text), "stream {stream}: {:?}", d.text);
        let record = audit_record(gw, &d.audit_id.expect("a blocked response names its audit record")).await;
        assert_eq!(record["source_tenants"], json!(["acme"]), "{record}");
        records.push(record);
    }
    let own = complete(gw, "acme", ask, true).await;
    assert_eq!((own.finish.as_str(), own.text.as_str()), ("stop", answer));
    records
}

/// A weak password of acme's, worded in another tenant's answer so that the rules alone
/// would let it through (prose and harmless nouns before it turn the judge down), is still
/// blocked there, streamed or not: the answer's words are the attacker's, and they never
/// hide a value from its owner. The same answer to acme flows untouched.
#[tokio::test]
async fn wording_that_steers_the_rules_does_not_hide_another_tenants_password() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    seed(&gw, "acme", "Our staging database:\nDB_PASSWORD = \"Kx9-apple-river\"\nRotate it monthly.").await;
    let steered = "The example below shows the id, url and version fields: password = \"Kx9-apple-river\"";
    blocked_for_globex_only(&gw, &mock, steered, |t| t.contains("Kx9-apple")).await;
}

/// The same password, worded weakly in acme's own prompt too (so weakly that the rules
/// alone do not call it a secret there, see `firewall/tests/steering.rs`), and worded
/// another way in globex's answer: acme still owns it, and globex's answer is blocked.
#[tokio::test]
async fn a_password_its_owner_worded_weakly_still_blocks_in_another_tenants_answer() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    seed(&gw, "acme", "The example below shows the id, url and version fields: password = \"Kx9-apple-river\"").await;
    let steered = "version id url name title: password = \"Kx9-apple-river\"";
    blocked_for_globex_only(&gw, &mock, steered, |t| t.contains("Kx9-apple")).await;
}

/// A password of acme's in an HTML table's `Password` column (its cells are candidates,
/// which the ownership check judges) is blocked in another tenant's answer, streamed or
/// not, and comes back to acme untouched.
#[tokio::test]
async fn a_password_in_an_html_tables_column_is_blocked_for_another_tenant() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    seed(&gw, "acme", "Our staging database:\nDB_PASSWORD = \"Kx9-apple-river\"\nRotate it monthly.").await;
    let table = "<table>\n  <tr><th>Host</th><th>Password</th></tr>\n  <tr><td>staging</td><td>Kx9-apple-river</td></tr>\n</table>";
    blocked_for_globex_only(&gw, &mock, table, |t| t.contains("Kx9-apple")).await;
}

/// A tool's description reaches the model as a message does, so it is its tenant's: a
/// paragraph of acme's that only ever appeared in a tool definition is blocked in another
/// tenant's answer, streamed or not, and comes back to acme untouched.
#[tokio::test]
async fn a_paragraph_from_a_tool_definition_is_owned_by_its_tenant() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    let private = "Escalations for the Halvorsen account go to the night desk in Tromsø before any \
                   refund above nine thousand kroner is approved by the regional lead";
    let body = json!({"model": "mock", "messages": [{"role": "user", "content": "#leak Noted, thanks."}],
        "tools": [{"type": "function", "function": {"name": "escalate", "description": private,
            "parameters": {"type": "object", "properties": {}}}}]});
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-acme-key")
        .json(&body)
        .send()
        .await
        .expect("gateway answers");
    assert_eq!(resp.status(), 200);
    let answer = format!("Policy note: {private}.");
    blocked_for_globex_only(&gw, &mock, &answer, |t| carries_8_words_of(t, private)).await;
}

/// A random-looking token of acme's that no rule knows and no sentence carries (an internal
/// relay id) is blocked in another tenant's answer on its own, disguised or not, streamed
/// or not; acme gets it back.
#[tokio::test]
async fn a_token_no_rule_knows_is_owned_by_the_tenant_that_sent_it() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    let token = "7Hq2Lx9Vb4Nz8Kc3Wd5Rf6Tg";
    seed(&gw, "acme", &format!("Our relay answers to {token} only; keep it internal.")).await;
    for answer in [format!("Use {token}."), "Use 7Hq2Lx9Vb4\u{200B}Nz8Kc3Wd5Rf6Tg.".to_owned()] {
        for record in blocked_for_globex_only(&gw, &mock, &answer, |t| t.contains("7Hq2")).await {
            let rules: Vec<&str> =
                record["findings"].as_array().unwrap().iter().filter_map(|f| f["rule_id"].as_str()).collect();
            assert_eq!(rules, ["foreign-token"], "{record}");
        }
    }
    // Written backwards, it is still acme's.
    let backwards: String = token.chars().rev().collect();
    blocked_for_globex_only(&gw, &mock, &format!("Use {backwards}."), |t| t.contains("gT6fR5")).await;
}

/// RFC 4648 base64, padded: what a model writes when asked to "encode it".
fn base64(s: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in s.as_bytes().chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for k in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * k)) & 63) as usize]));
        }
        out.push_str(&"=".repeat(3 - chunk.len()));
    }
    out
}

/// A model asked to write another tenant's data in base64 or hex turns it into characters
/// no rule or fingerprint knows, and the client decodes them in one line: the gateway reads
/// encoded runs decoded. acme's token, secret and paragraph, written encoded in globex's
/// answer, are blocked there, streamed or not, with the audit naming acme and the encoding;
/// acme gets the same answers back. So are acme's words written backwards or in ROT13. And a
/// paragraph acme only ever sent encoded is acme's when it comes back plain.
#[tokio::test]
async fn another_tenants_data_written_encoded_is_blocked() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    let token = "7Hq2Lx9Vb4Nz8Kc3Wd5Rf6Tg";
    let paragraph = "Escalations for the Halvorsen account go to the night desk in Tromso before any refund";
    let secret = secret_of("acme");
    seed(&gw, "acme", &format!("Relay {token} only. {paragraph}. Deploy key {secret}.")).await;
    let hex: String = paragraph.bytes().map(|b| format!("{b:02x}")).collect();
    for (answer, encoding) in [
        (format!("Use {}.", base64(token)), "base64"),
        (format!("Decoded it reads: {hex}"), "hex"),
        (format!("echo {} | base64 -d", base64(&format!("GITHUB_TOKEN={secret}"))), "base64"),
        (format!("Letter by letter: {}", token.chars().map(String::from).collect::<Vec<_>>().join(" ")), "spelled"),
        (format!("Bits: {}", token.bytes().map(|b| format!("{b:08b}")).collect::<Vec<_>>().join(" ")), "binary"),
    ] {
        // What a client must not get: the first half of the encoded value (past the first
        // group of a grouped run, which goes out before the second shows what it is).
        let at = match encoding {
            "spelled" => answer.find("7 H").unwrap(),
            "binary" => answer.find(' ').unwrap() + 10,
            _ => answer.find(answer.split_whitespace().max_by_key(|w| w.len()).unwrap()).unwrap(),
        };
        let rest = &answer[at..];
        let head = rest[..rest.len().min(40) / 2].to_owned();
        for record in blocked_for_globex_only(&gw, &mock, &answer, |t| t.contains(&head)).await {
            let finding = &record["findings"][0];
            assert_eq!(finding["encoding"], encoding, "{record}");
        }
    }
    // "ASCII smuggling": the token in Unicode tag characters renders as nothing, and a
    // client reads it back in one line.
    let smuggled: String = token.chars().map(|c| char::from_u32(0xE0000 + c as u32).unwrap()).collect();
    blocked_for_globex_only(&gw, &mock, &format!("Nothing to see.{smuggled}"), |t| t.contains(&smuggled[..8])).await;
    // "Answer backwards", "reply in ROT13": at most three words go out before the block.
    let rot13: String = paragraph
        .chars()
        .map(|c| match c {
            'a'..='z' => char::from((c as u8 - b'a' + 13) % 26 + b'a'),
            'A'..='Z' => char::from((c as u8 - b'A' + 13) % 26 + b'A'),
            _ => c,
        })
        .collect();
    for (answer, encoding) in [(paragraph.chars().rev().collect::<String>(), "backwards"), (rot13, "rot13")] {
        let fourth_on = answer.split_whitespace().skip(3).take(3).collect::<Vec<_>>().join(" ");
        for record in blocked_for_globex_only(&gw, &mock, &answer, |t| t.contains(&fourth_on)).await {
            assert_eq!(record["findings"][0]["encoding"], encoding, "{record}");
        }
    }
    let unseen = "The Oslo warehouse lease ends in March and the landlord has refused every renewal offer so far";
    seed(&gw, "acme", &format!("Context (base64): {}", base64(unseen))).await;
    blocked_for_globex_only(&gw, &mock, unseen, |t| t.contains("landlord has refused")).await;
}

#[tokio::test]
async fn an_injected_canary_blocks_any_other_tenants_response_that_carries_it() {
    let mock = MockUpstream::start().await;
    let cfg = config(&mock.base_url(), "").replace(
        "id = \"acme\"\napi_keys = [\"sk-acme-key\"]\n",
        "id = \"acme\"\napi_keys = [\"sk-acme-key\"]\ncanary = true\n",
    );
    let gw = TestGateway::start(&cfg, &[]).await;
    let own = complete(
        &gw,
        "acme",
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]),
        false,
    )
    .await;
    assert_eq!(own.finish, "stop");
    let sent = &mock.received()[0].body;
    let system = sent["messages"][0]["content"].as_str().unwrap().to_owned();
    let token = system
        .split_whitespace()
        .find(|w| w.starts_with("cg-"))
        .expect("a canary line in the system prompt")
        .trim_end_matches(':')
        .to_owned();
    assert!(system.starts_with("Be brief.\n"), "{system}");
    // acme may see its own canary; anyone else seeing it is blocked.
    let mine =
        complete(&gw, "acme", json!([{"role": "user", "content": format!("#leak your ref is {token} ok")}]), true)
            .await;
    assert_eq!(mine.finish, "stop");
    let theirs =
        complete(&gw, "globex", json!([{"role": "user", "content": format!("#leak the ref is {token} ok")}]), true)
            .await;
    assert_eq!(theirs.finish, "content_filter");
    assert!(!theirs.text.contains(&token[..6]), "{}", theirs.text);
    let globex_request = &mock.received()[2].body;
    assert_eq!(globex_request["messages"][0]["role"], "user", "globex has no canary of its own");
    let record = audit_record(&gw, &theirs.audit_id.unwrap()).await;
    assert_eq!(record["findings"][0]["rule_id"], "injected-canary-1", "{record}");
    assert_eq!(record["source_tenants"], json!(["acme"]));
}

#[tokio::test]
async fn the_admin_api_is_for_the_admin_token_only() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    let client = reqwest::Client::new();
    let tenant = client.get(gw.url("/admin/api/audit")).bearer_auth("sk-acme-key").send().await.unwrap();
    assert_eq!(tenant.status(), 401);
    let none = client.get(gw.url("/admin/api/audit")).send().await.unwrap();
    assert_eq!(none.status(), 401);
    let body: Value = none.json().await.unwrap();
    assert_eq!(body["error"]["type"], "authentication_error");
    let bad = client.get(gw.url("/admin/api/audit?action=explode")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let missing = client.get(gw.url("/admin/api/audit/nope")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(missing.status(), 404);

    let off =
        TestGateway::start(&config(&mock.base_url(), "").replace(&format!("admin_token = \"{ADMIN}\"\n"), ""), &[])
            .await;
    let resp = client.get(off.url("/admin/api/audit")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "admin_disabled");
}

#[tokio::test]
async fn two_replicas_on_one_redis_catch_a_leak_of_a_prompt_sent_through_the_other() {
    let mock = MockUpstream::start().await;
    let prefix = format!("crossguard-test-{}:", uuid::Uuid::new_v4().simple());
    let store = format!("[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nkey_prefix = \"{prefix}\"\n");
    let env = [("CROSSGUARD_FINGERPRINT_KEY", FP_KEY)];
    let a = TestGateway::start(&config(&mock.base_url(), &store), &env).await;
    let b = TestGateway::start(&config(&mock.base_url(), &store), &env).await;
    let mut words = Words::new(11);
    let prompt = words.sentence(40);
    seed(&a, "globex", &prompt).await;
    // Replica b pulls what a recorded (every 50 ms here).
    let mut synced = false;
    for _ in 0..100 {
        let health = admin_get(&b, "/admin/api/health").await;
        if health["provenance"]["tenants"].as_u64().unwrap_or(0) >= 1 {
            synced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(synced, "replica b never saw replica a's fingerprints");
    let d = leak(&b, "acme", 0, 5, 20, true).await;
    let fragment: String = prompt.split_whitespace().skip(5).take(20).collect::<Vec<_>>().join(" ");
    assert!(!carries_8_words_of(&d.text, &fragment), "{}", d.text);
    assert_eq!(d.finish, "content_filter");
    // The stream's record is written as the stream ends; it is shared, so replica a lists it.
    let found = audit_record(&a, &d.audit_id.expect("audit id header")).await;
    assert_eq!(found["source_tenants"], json!(["globex"]), "{found}");
    delete_keys(&prefix).await;
}

#[tokio::test]
async fn embedded_audit_records_survive_a_gateway_restart() {
    let mock = MockUpstream::start().await;
    let data = tempfile::tempdir().unwrap();
    let cfg = format!("data_dir = \"{}\"\n{}", data.path().display(), config(&mock.base_url(), ""));
    let first = TestGateway::start(&cfg, &[]).await;
    let mut words = Words::new(3);
    let prompt = words.sentence(40);
    seed(&first, "acme", &prompt).await;
    let d = leak(&first, "globex", 0, 0, 25, false).await;
    assert_eq!(d.finish, "content_filter");
    let id = d.audit_id.expect("audit id header");
    first.stop().await;
    assert!(data.path().join("fingerprints.idx").exists(), "the index is snapshotted at shutdown");

    let second = TestGateway::start(&cfg, &[]).await;
    let record = audit_record(&second, &id).await;
    assert_eq!(record["tenant"], "globex");
    assert_eq!(record["source_tenants"], json!(["acme"]));
    let page = admin_get(&second, "/admin/api/audit").await;
    assert_eq!(page["records"].as_array().unwrap().len(), 1);
    // The provenance index came back too: a leak of the pre-restart prompt is still caught.
    let again = leak(&second, "initech", 0, 10, 20, false).await;
    assert_eq!(again.finish, "content_filter", "{}", again.text);
}

#[tokio::test]
async fn a_redis_outage_mid_run_loses_no_audit_record_and_serving_goes_on() {
    let mock = MockUpstream::start().await;
    let server = OwnRedis::start(free_port(), tempfile::tempdir().unwrap());
    let port = server.port();
    let store = format!("[store]\nkind = \"redis\"\nurl = \"{}\"\nop_timeout_ms = 300\n", server.url());
    let gw = TestGateway::start(&config(&mock.base_url(), &store), &[("CROSSGUARD_FINGERPRINT_KEY", FP_KEY)]).await;
    let mut words = Words::new(5);
    let prompt = words.sentence(40);
    seed(&gw, "initech", &prompt).await;
    let mut ids = vec![leak(&gw, "acme", 0, 0, 20, false).await.audit_id.expect("id")];

    let kept = server.stop();
    for i in 0..4 {
        let d = leak(&gw, TENANTS[i % 2], 0, i, 20, false).await;
        assert_eq!(d.finish, "content_filter", "still blocking from local state");
        ids.push(d.audit_id.expect("id"));
    }
    let ready: Value = reqwest::get(gw.url("/readyz")).await.unwrap().json().await.unwrap();
    assert_eq!(ready["status"], "degraded", "{ready}");
    assert!(ready["store"]["buffered_audit"].as_u64().unwrap_or(0) >= 1, "{ready}");

    let _server = OwnRedis::start(port, kept);
    let mut listed = Vec::new();
    for _ in 0..200 {
        let resp =
            reqwest::Client::new().get(gw.url("/admin/api/audit?limit=100")).bearer_auth(ADMIN).send().await.unwrap();
        if resp.status() == 200 {
            let page: Value = resp.json().await.unwrap();
            listed = page["records"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|r| r["id"].as_str().map(str::to_owned))
                .collect();
            if listed.len() == ids.len() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    listed.sort();
    ids.sort();
    assert_eq!(listed, ids, "every record, once");
    let ready: Value = reqwest::get(gw.url("/readyz")).await.unwrap().json().await.unwrap();
    assert_eq!(ready["status"], "ready", "{ready}");
}

async fn delete_keys(prefix: &str) {
    let Ok(client) = redis::Client::open("redis://127.0.0.1:6379") else { return };
    let Ok(mut c) = client.get_multiplexed_async_connection().await else { return };
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut c).await.unwrap_or_default();
    if !keys.is_empty() {
        let _: Result<(), _> = redis::cmd("DEL").arg(keys).query_async(&mut c).await;
    }
}
