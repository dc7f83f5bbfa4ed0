//! The admin dashboard (`/admin`), end to end.
//!
//! - Plain HTTP: the session cookie's flags, the CSRF refusal (a forged reload changes
//!   nothing), the Content-Security-Policy, log-out, that the admin token is accepted
//!   only from a POST body and never comes back in a URL, a header or a page, and that a
//!   rule file the folder watch rejected shows on the rules page with its error.
//! - A real headless Chromium (driven over WebDriver), one session for every case: a wrong
//!   token cannot log in; logging in; a leak triggered through the API appears live; its
//!   detail; filtering by tenant; reloading rules (good and broken files); `<script>` and
//!   `<img onerror>` payloads render inert; the pages at 1280×800 and on a narrow screen.
//!   Screenshots of each page go to `target/dashboard-screenshots/`.
//!
//! The browser test needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian packages
//! `chromium` and `chromium-driver`, installed by `scripts/test.sh`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::own_redis::free_port;
use crossguard_e2e::TestGateway;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-0123456789-dashboard";
const TENANTS: [&str; 3] = ["acme", "globex", "initech"];
/// Request id of the payload test: a whole script element, in a field the record keeps verbatim.
const SCRIPT_REQUEST_ID: &str = "<script>window.__pwned=3</script>";
/// The payload response: markup that would run if any page inserted it unescaped.
const PAYLOAD: &str =
    "Here you go: <script>window.__pwned=1</script> and <img src=x onerror=\"window.__pwned=2\"> done.";

/// A rule file of the test's own: blocks markup payloads, so their records exist.
const PAYLOAD_RULES: &str = r#"
[[rule]]
id = "html-payload"
description = "Markup that would run in a browser: <script> tags, <img onerror> handlers"
severity = "high"
action = "block"
regex = '''<(?:script|img)\b[^>]{0,80}>'''
keywords = ["<script", "<img"]
must_match = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>"]
must_not_match = ["a < b and c > d", "<p>hello</p>"]
"#;

/// A rules folder: the shipped code-hosting rules (GitHub tokens) and the shared lists they
/// name, plus [`PAYLOAD_RULES`].
fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("rules dir");
    for file in ["code-hosting.toml", "allow-lists.toml"] {
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rules").join(file);
        std::fs::copy(shipped, dir.path().join(file)).expect("copy shipped rules");
    }
    std::fs::write(dir.path().join("payload.toml"), PAYLOAD_RULES).expect("write payload rules");
    dir
}

fn config(base_url: &str, rules: &Path) -> String {
    let mut text = format!("admin_token = \"{ADMIN}\"\n");
    // The scripts put each secret in the asker's own message, so the secret is its own:
    // blocking own secrets too makes every scripted secret a block to show.
    for t in TENANTS {
        text.push_str(&format!("[[tenants]]\nid = \"{t}\"\napi_keys = [\"sk-{t}-key\"]\nown_secrets = \"block\"\n"));
    }
    text.push_str(&format!(
        "[[models]]\nid = \"mock\"\nbackend = \"upstream\"\nbase_url = \"{base_url}\"\n\
         [firewall]\nrules_dir = \"{}\"\n[provenance]\nrefresh_interval_ms = 50\n",
        rules.display()
    ));
    text
}

struct Setup {
    _mock: MockUpstream,
    gw: TestGateway,
    rules: tempfile::TempDir,
}

async fn setup() -> Setup {
    let mock = MockUpstream::start().await;
    let rules = rules_dir();
    let gw = TestGateway::start(&config(&mock.base_url(), rules.path()), &[]).await;
    Setup { _mock: mock, gw, rules }
}

/// A client that shows redirects instead of following them.
fn http() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("http client")
}

/// One completion; returns its audit id when the firewall acted.
async fn complete(gw: &TestGateway, tenant: &str, content: &str, request_id: Option<&str>) -> Option<String> {
    let mut req = http()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(format!("sk-{tenant}-key"))
        .json(&json!({"model": "mock", "messages": [{"role": "user", "content": content}]}));
    if let Some(id) = request_id {
        req = req.header("x-request-id", id);
    }
    let resp = req.send().await.expect("gateway answers");
    assert_eq!(resp.status(), 200);
    let audit = resp.headers().get("x-crossguard-audit-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body: Value = resp.json().await.expect("json body");
    let finish = body["choices"][0]["finish_reason"].as_str().unwrap_or("").to_owned();
    (finish == "content_filter").then_some(audit).flatten()
}

/// Waits until the audit record `id` is stored (records are written in the background,
/// just after the response ends), so that the next one is written after it.
async fn recorded(gw: &TestGateway, id: &str) -> String {
    for _ in 0..500 {
        let resp =
            http().get(gw.url(&format!("/admin/api/audit/{id}"))).bearer_auth(ADMIN).send().await.expect("audit api");
        if resp.status() == 200 {
            return id.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("audit record {id} was never written");
}

/// A GitHub-token-shaped secret (the shipped rules block it).
fn github_secret() -> String {
    "ghp_Xk3pQ9zLm7Wc2Rt8Yv5Nb1Hd6Fg4Sa0UeJ7q".to_owned()
}

/// Logs in over plain HTTP; returns the `Set-Cookie` header and the `name=value` pair.
async fn login(gw: &TestGateway, token: &str) -> reqwest::Response {
    http().post(gw.url("/admin/login")).form(&[("token", token)]).send().await.expect("login answers")
}

fn session_cookie(resp: &reqwest::Response) -> String {
    let set = resp.headers().get("set-cookie").and_then(|v| v.to_str().ok()).expect("a session cookie");
    set.split(';').next().unwrap_or_default().to_owned()
}

async fn page(gw: &TestGateway, path: &str, cookie: &str) -> reqwest::Response {
    http().get(gw.url(path)).header("cookie", cookie).send().await.expect("page answers")
}

/// The hidden CSRF field's value in a page.
fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + "name=\"csrf\" value=\"".len();
    html[at..].split('"').next().unwrap_or_default().to_owned()
}

async fn rules_generation(gw: &TestGateway) -> u64 {
    let resp = http().get(gw.url("/admin/api/health")).bearer_auth(ADMIN).send().await.expect("health");
    let v: Value = resp.json().await.expect("health json");
    v["rules"]["generation"].as_u64().expect("a generation")
}

#[tokio::test]
async fn sessions_are_http_only_strict_cookies_and_the_token_never_travels_in_a_url() {
    let s = setup().await;
    let gw = &s.gw;

    // Pages need a session; the login page is the way in.
    let resp = page(gw, "/admin", "").await;
    assert_eq!((resp.status().as_u16(), resp.headers()["location"].to_str().ok()), (303, Some("/admin/login")));

    // A wrong token: 401, no cookie.
    let resp = login(gw, "admin-token-0123456789-wrong!").await;
    assert_eq!(resp.status(), 401);
    assert!(resp.headers().get("set-cookie").is_none());
    assert!(resp.text().await.unwrap_or_default().contains("Incorrect admin token."));

    // The token in a URL does nothing: GET shows the form, POST with an empty body fails.
    let resp = http().get(gw.url(&format!("/admin/login?token={ADMIN}"))).send().await.expect("answers");
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("set-cookie").is_none());
    let form = resp.text().await.unwrap_or_default();
    assert!(form.contains("method=\"post\" action=\"/admin/login\"") && !form.contains(ADMIN));
    let resp = http()
        .post(gw.url(&format!("/admin/login?token={ADMIN}")))
        .form(&[("token", "")])
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status(), 401);

    // The right token: a strict, HttpOnly session cookie that is not the token.
    let resp = login(gw, ADMIN).await;
    assert_eq!(resp.status(), 303);
    let location = resp.headers()["location"].to_str().unwrap_or_default().to_owned();
    assert_eq!(location, "/admin");
    let set_cookie = resp.headers()["set-cookie"].to_str().unwrap_or_default().to_owned();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/admin"] {
        assert!(set_cookie.split("; ").any(|f| f == flag), "{flag} missing in {set_cookie}");
    }
    assert!(!set_cookie.contains(ADMIN));
    let cookie = session_cookie(&resp);

    // Every page: the CSP forbids inline script, and the token is nowhere in it.
    for path in
        ["/admin", "/admin/tenants", "/admin/rules", "/admin/health", "/admin/rules/html-payload", "/admin/login"]
    {
        let resp = page(gw, path, &cookie).await;
        assert_eq!(resp.status(), 200, "{path}");
        let csp = resp.headers()["content-security-policy"].to_str().unwrap_or_default().to_owned();
        assert!(
            csp.contains("script-src 'self'")
                && !csp.contains("unsafe-inline")
                && csp.contains("frame-ancestors 'none'"),
            "{csp}"
        );
        assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
        let html = resp.text().await.unwrap_or_default();
        assert!(!html.contains(ADMIN), "{path} shows the admin token");
        assert!(!html.contains("<script>") && !html.contains("<img"), "{path} has inline script or markup from data");
    }
}

#[tokio::test]
async fn forms_without_the_session_csrf_token_are_refused() {
    let s = setup().await;
    let gw = &s.gw;
    let cookie = session_cookie(&login(gw, ADMIN).await);
    let html = page(gw, "/admin/rules", &cookie).await.text().await.unwrap_or_default();
    let csrf = csrf_of(&html);
    assert_eq!(csrf.len(), 64);
    let before = rules_generation(gw).await;

    for forged in ["", "0000000000000000000000000000000000000000000000000000000000000000", &csrf[..63]] {
        let resp = http()
            .post(gw.url("/admin/rules/reload"))
            .header("cookie", &cookie)
            .form(&[("csrf", forged)])
            .send()
            .await
            .expect("answers");
        assert_eq!(resp.status(), 403, "forged token {forged:?}");
    }
    // Another session's token is no good either.
    let other = session_cookie(&login(gw, ADMIN).await);
    let resp = http()
        .post(gw.url("/admin/rules/reload"))
        .header("cookie", &other)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status(), 403);
    assert_eq!(rules_generation(gw).await, before, "a refused form must not reload");

    let resp = http()
        .post(gw.url("/admin/rules/reload"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("answers");
    assert_eq!((resp.status().as_u16(), resp.headers()["location"].to_str().ok()), (303, Some("/admin/rules")));
    assert_eq!(rules_generation(gw).await, before + 1);

    // Log-out needs the token too, and ends the session.
    let resp = http()
        .post(gw.url("/admin/logout"))
        .header("cookie", &cookie)
        .form(&[("csrf", "nope")])
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status(), 403);
    let resp = http()
        .post(gw.url("/admin/logout"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status(), 303);
    assert_eq!(page(gw, "/admin", &cookie).await.status(), 303, "a logged-out session must not open pages");
    assert_eq!(page(gw, "/admin", &other).await.status(), 200, "other sessions stay");
}

#[tokio::test]
async fn the_rules_page_shows_what_the_folder_watch_rejected() {
    let s = setup().await;
    let cookie = session_cookie(&login(&s.gw, ADMIN).await);
    let rules_page = || async { page(&s.gw, "/admin/rules", &cookie).await.text().await.unwrap_or_default() };
    assert!(rules_page().await.contains("No reload since start-up."));
    let before = rules_generation(&s.gw).await;

    // Nobody presses a button: the folder watch (on by default) tries the file. It is
    // renamed into place whole: caught between `write`'s create and its bytes, an empty
    // `broken.toml` loads fine, and that watch reload is not the one this test waits for.
    let part = s.rules.path().join("broken.part");
    std::fs::write(&part, "[[rule]]\nid = \"Not Kebab\"\n").expect("write broken rules");
    std::fs::rename(&part, s.rules.path().join("broken.toml")).expect("move broken rules into place");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let html = loop {
        let html = rules_page().await;
        if html.contains("by the rule folder watch") {
            break html;
        }
        assert!(std::time::Instant::now() < deadline, "no reload by the watch shown after 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let card = html
        .split("<div class=\"card reload\">")
        .nth(1)
        .and_then(|rest| rest.split("</div>").next())
        .unwrap_or_default();
    assert!(card.contains("Rejected") && card.contains("broken.toml:1: rule `Not Kebab`"), "{card}");
    assert!(card.contains(&format!("the running rules stay (generation {before})")), "{card}");
    assert_eq!(rules_generation(&s.gw).await, before);
}

#[tokio::test]
async fn lists_page_newest_first_and_keep_their_filters() {
    let s = setup().await;
    let gw = &s.gw;
    let cookie = session_cookie(&login(gw, ADMIN).await);
    let mut ids = Vec::new();
    for i in 0..27 {
        let tenant = if i % 9 == 0 { "acme" } else { "globex" };
        let id = complete(gw, tenant, &format!("#leak token {}", github_secret()), None).await.expect("blocked");
        ids.push((tenant, recorded(gw, &id).await));
    }
    let row_ids = |html: &str| -> Vec<String> {
        html.split("<tr data-id=\"").skip(1).map(|rest| rest.split('"').next().unwrap_or_default().to_owned()).collect()
    };
    let newest_first: Vec<String> = ids.iter().rev().map(|(_, id)| id.clone()).collect();

    // 25 a page: the newest 25, then the 2 oldest behind the "Older" link.
    let first = page(gw, "/admin", &cookie).await.text().await.unwrap_or_default();
    assert_eq!(row_ids(&first), newest_first[..25]);
    let older = first
        .split("<a href=\"")
        .find(|a| a.contains("rel=\"next\""))
        .and_then(|a| a.split('"').next())
        .expect("an Older link");
    let second = page(gw, &older.replace("&amp;", "&"), &cookie).await.text().await.unwrap_or_default();
    assert_eq!(row_ids(&second), newest_first[25..]);
    assert!(
        !second.contains("rel=\"next\"") && !second.contains("data-live"),
        "the last page has no next link and no live feed"
    );

    // Filters narrow the list; the time range is UTC minutes.
    let acme = page(gw, "/admin?tenant=acme&action=block", &cookie).await.text().await.unwrap_or_default();
    let acme_ids: Vec<String> = ids.iter().rev().filter(|(t, _)| *t == "acme").map(|(_, id)| id.clone()).collect();
    assert_eq!(row_ids(&acme), acme_ids);
    assert!(acme.contains("data-live=\"/admin/events?tenant=acme&amp;action=block\""));
    let future = page(gw, "/admin?since=2999-01-01T00:00", &cookie).await.text().await.unwrap_or_default();
    assert!(row_ids(&future).is_empty() && future.contains("No blocked or redacted responses match."));
    let past = page(gw, "/admin?until=2000-01-01T00:00", &cookie).await.text().await.unwrap_or_default();
    assert!(row_ids(&past).is_empty());
    let bad = page(gw, "/admin?since=yesterday", &cookie).await.text().await.unwrap_or_default();
    assert!(bad.contains("Filter ignored") && row_ids(&bad).len() == 25);
}

/// chromedriver on a free port, and one WebDriver session of headless Chromium.
struct Browser {
    client: Client,
    _driver: tokio::process::Child,
    shots: PathBuf,
}

impl Browser {
    async fn start() -> Browser {
        for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: install the Debian packages chromium and chromium-driver (scripts/test.sh does)"
            );
        }
        let port = free_port();
        let driver = tokio::process::Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": "/usr/bin/chromium", "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                "--disable-dev-shm-usage", "--window-size=1280,800"
            ]}),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a WebDriver session");
        let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots");
        std::fs::create_dir_all(&shots).expect("screenshot dir");
        Browser { client, _driver: driver, shots }
    }

    /// Saves a screenshot of the whole page: the window grows to the page's height for it.
    async fn shot(&self, name: &str) {
        let (width, height) = self.client.get_window_size().await.expect("window size");
        let page =
            self.js("return document.documentElement.scrollHeight - window.innerHeight;").await.as_u64().unwrap_or(0);
        if page > 0 {
            self.client
                .set_window_size(width as u32, height as u32 + page.min(3000) as u32)
                .await
                .expect("grow window");
        }
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::write(self.shots.join(format!("{name}.png")), png).expect("write screenshot");
        self.client.set_window_size(width as u32, height as u32).await.expect("restore window");
    }

    async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
    }

    async fn text(&self, css: &str) -> String {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .text()
            .await
            .unwrap_or_default()
    }

    /// The text of the first `css` match as written (`textContent`: no CSS case changes).
    async fn content(&self, css: &str) -> String {
        self.wait_for(css).await;
        let script = format!("return document.querySelector({}).textContent;", json!(css));
        self.js(&script).await.as_str().unwrap_or_default().to_owned()
    }

    async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// True when nothing a record carried ran or became an element: no `__pwned`, no
    /// `<img>`, and the only script is the dashboard's own file.
    async fn inert(&self) -> bool {
        self.js("return window.__pwned === undefined && document.querySelectorAll('img').length === 0 \
             && document.scripts.length === 1 && document.scripts[0].src.endsWith('/admin/assets/admin.js');")
            .await
            == json!(true)
    }

    async fn log_in(&self, base: &str, token: &str) {
        self.client.goto(&format!("{base}/admin/login")).await.expect("login page");
        self.wait_for("#token").await.send_keys(token).await.expect("type token");
        self.wait_for("form.login button").await.click().await.expect("submit");
    }
}

#[tokio::test]
async fn the_dashboard_in_a_real_browser() {
    let s = setup().await;
    let gw = &s.gw;
    let base = gw.url("");
    let b = Browser::start().await;

    // A wrong token cannot log in.
    b.log_in(&base, "admin-token-0123456789-wrong!").await;
    b.wait_for("p.error").await;
    assert_eq!(b.text("p.error").await, "Incorrect admin token.");
    assert!(b.client.find(Locator::Css("header nav")).await.is_err(), "no navigation without a session");
    b.shot("login-refused").await;

    // Log in: the blocked-responses page, no token in the URL.
    b.log_in(&base, ADMIN).await;
    b.wait_for("#rows").await;
    let url = b.client.current_url().await.expect("url").to_string();
    assert!(url.ends_with("/admin") && !url.contains(ADMIN), "{url}");
    assert_eq!(b.text("h1").await, "Blocked responses");
    b.wait_for("#live.on").await; // the live feed is subscribed
    b.shot("blocked-empty").await;

    // A leak through the API appears live: globex's prompt spliced into acme's answer.
    let globex_prompt =
        "quarterly river port customs paperwork pallet labels driver shortage fuel surcharge regional manager \
                         asked for summary of open issues and owners by friday before board meeting next month";
    assert_eq!(complete(gw, "globex", globex_prompt, None).await, None);
    let splice = complete(gw, "acme", "#splice 0 0 20", None).await.expect("the splice is blocked");
    let row = b.wait_for(&format!("#rows tr.fresh[data-id=\"{splice}\"]")).await;
    let cells = row.text().await.unwrap_or_default();
    assert!(cells.contains("acme") && cells.contains("globex") && cells.contains("block"), "{cells}");
    b.shot("blocked-live").await;

    // Its detail: the finding, the foreign owner, the byte map.
    row.find(Locator::Css("a.open")).await.expect("detail link").click().await.expect("open detail");
    b.wait_for("section.finding").await;
    assert_eq!(b.text("h1").await, "Blocked response");
    let detail = b.content("main").await;
    assert!(detail.contains("Foreign n-gram owners") && detail.contains("globex"), "{detail}");
    assert!(!detail.contains(&globex_prompt[..30]), "the detail shows raw text");
    b.wait_for("section.finding mark").await;
    b.wait_for("svg.spans rect.hit").await;
    b.shot("detail").await;

    // Payloads: a GitHub token for globex, markup for initech, both arriving live.
    b.client.goto(&format!("{base}/admin")).await.expect("list");
    b.wait_for("#live.on").await;
    let secret = complete(gw, "globex", &format!("#leak your token is {} keep it safe", github_secret()), None)
        .await
        .expect("secret blocked");
    let payload =
        complete(gw, "initech", &format!("#leak {PAYLOAD}"), Some(SCRIPT_REQUEST_ID)).await.expect("payload blocked");
    b.wait_for(&format!("#rows tr.fresh[data-id=\"{secret}\"]")).await;
    b.wait_for(&format!("#rows tr.fresh[data-id=\"{payload}\"]")).await;
    assert!(b.inert().await, "a live row ran or built markup");
    assert!(!b.content("main").await.contains(&github_secret()[4..]), "a raw secret is shown");
    b.shot("blocked-payloads-live").await;

    b.client.goto(&format!("{base}/admin/audit/{payload}")).await.expect("payload detail");
    b.wait_for("section.finding").await;
    assert!(b.inert().await, "the detail page ran or built markup");
    let detail = b.content("main").await;
    assert!(detail.contains(SCRIPT_REQUEST_ID) && detail.contains("html-payload"), "{detail}");
    b.shot("detail-payload").await;

    // Filter by tenant with the form (server-rendered: a plain GET).
    b.client.goto(&format!("{base}/admin")).await.expect("list");
    assert!(b.inert().await, "the list page ran or built markup");
    assert_eq!(b.client.find_all(Locator::Css("#rows tr")).await.expect("rows").len(), 3);
    b.wait_for("select[name=tenant]").await.select_by_value("globex").await.expect("pick globex");
    b.wait_for("form.filters button").await.click().await.expect("filter");
    b.wait_for("select[name=tenant] option[value=globex][selected]").await; // the filtered page
    let url = b.client.current_url().await.expect("url").to_string();
    assert!(url.contains("tenant=globex"), "{url}");
    let rows = b.client.find_all(Locator::Css("#rows tr")).await.expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].attr("data-id").await.ok().flatten().as_deref(), Some(secret.as_str()));
    // The live feed keeps the filter: acme's new block is not added, globex's is.
    b.wait_for("#live.on").await;
    let acme_again = complete(gw, "acme", &format!("#leak {}", github_secret()), None).await.expect("blocked");
    recorded(gw, &acme_again).await; // announced before globex's below
    let globex_again = complete(gw, "globex", &format!("#leak {}", github_secret()), None).await.expect("blocked");
    b.wait_for(&format!("#rows tr.fresh[data-id=\"{globex_again}\"]")).await;
    // Records reach the feed in the order they were written, so acme's would be here by now.
    assert!(
        b.client.find(Locator::Css(&format!("#rows tr[data-id=\"{acme_again}\"]"))).await.is_err(),
        "the live feed ignored the filter"
    );
    assert_eq!(b.client.find_all(Locator::Css("#rows tr")).await.expect("rows").len(), 2);
    b.shot("blocked-filtered").await;

    // Tenants: counts and charts.
    b.client.goto(&format!("{base}/admin/tenants")).await.expect("tenants");
    b.wait_for("table.tenants").await;
    let rows = b.js("return Array.from(document.querySelectorAll('table.tenants tbody tr')).map(r => Array.from(r.cells).slice(0, 5).map(c => c.innerText.trim()).join('|'));").await;
    let rows: Vec<String> = serde_json::from_value(rows).unwrap_or_default();
    for expected in ["acme|2|2|0|100.0%", "globex|3|2|0|66.7%", "initech|1|1|0|100.0%"] {
        assert!(rows.iter().any(|r| r == expected), "{expected} not in {rows:?}");
    }
    b.wait_for("svg.bars rect.bar").await;
    b.shot("tenants").await;

    // Rules: reload works; a broken file is refused with its error, the old rules stay.
    b.client.goto(&format!("{base}/admin/rules")).await.expect("rules");
    b.wait_for("form.inline button").await.click().await.expect("reload");
    let outcome = b.content("div.reload").await;
    assert!(outcome.contains("Loaded") && outcome.contains("generation 2"), "{outcome}");
    std::fs::write(s.rules.path().join("broken.toml"), "[[rule]]\nid = \"Not Kebab\"\n").expect("write broken rules");
    b.wait_for("form.inline button").await.click().await.expect("reload");
    b.wait_for("div.reload p.error").await; // the new page, not the one clicked on
    let outcome = b.content("div.reload").await;
    assert!(
        outcome.contains("Rejected") && outcome.contains("broken.toml") && outcome.contains("generation 2"),
        "{outcome}"
    );
    b.shot("rules").await;
    std::fs::remove_file(s.rules.path().join("broken.toml")).expect("remove broken rules");

    // A rule's page: its samples (markup, shown as text) and its recent hit.
    b.client.goto(&format!("{base}/admin/rules/html-payload")).await.expect("rule page");
    b.wait_for("ul.samples").await;
    assert!(b.inert().await, "the rule page ran or built markup");
    assert!(b.content("main").await.contains("<img src=x onerror=alert(1)>"));
    assert_eq!(b.client.find_all(Locator::Css("#rows tr")).await.expect("rows").len(), 1);
    b.shot("rule").await;

    b.client.goto(&format!("{base}/admin/health")).await.expect("health");
    b.wait_for("section.card").await;
    assert!(b.content("main").await.contains("memory"));
    b.shot("health").await;

    // A narrow screen: nothing wider than the viewport but the scrolling tables.
    b.client.set_window_size(390, 844).await.expect("narrow window");
    for (path, name) in [
        ("/admin".to_owned(), "narrow-blocked"),
        (format!("/admin/audit/{splice}"), "narrow-detail"),
        ("/admin/tenants".to_owned(), "narrow-tenants"),
    ] {
        b.client.goto(&format!("{base}{path}")).await.expect("page");
        b.wait_for("main h1").await;
        let fits = b.js("return document.documentElement.scrollWidth <= window.innerWidth + 1;").await;
        assert_eq!(fits, json!(true), "{path} overflows a narrow screen");
        b.shot(name).await;
    }

    // Log out: the session is gone.
    b.client.set_window_size(1280, 800).await.expect("wide window");
    b.client.goto(&format!("{base}/admin")).await.expect("list");
    b.wait_for("form.logout button").await.click().await.expect("log out");
    b.wait_for("form.login").await;
    b.client.goto(&format!("{base}/admin/tenants")).await.expect("tenants");
    b.wait_for("form.login").await;
    let _ = b.client.close().await;
}
