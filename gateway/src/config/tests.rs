use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_parts(text, "test.toml", &[], &|_| None)
}

fn parse_env(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Config::from_parts(text, "test.toml", &env, &|name| match name {
        "UPSTREAM_KEY" => Some("upstream-secret".into()),
        "CROSSGUARD_FINGERPRINT_KEY" => Some("000102030405060708090a0b0c0d0e0f".into()),
        _ => None,
    })
}

const CONTRACT: &str = r#"
listen = "127.0.0.1:8080"
admin_token_env = "CROSSGUARD_ADMIN_TOKEN"
[[tenants]]
id = "acme"
api_keys = ["sk-acme-1"]
[[models]]
id = "mock"
backend = "upstream"
base_url = "http://127.0.0.1:9000/v1"
api_key_env = "UPSTREAM_KEY"
[store]
kind = "memory"
"#;

#[test]
fn the_contract_example_loads() {
    let cfg = parse_env(CONTRACT, &[]).unwrap();
    assert_eq!(cfg.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(cfg.tenants[0].id, "acme");
    assert_eq!(cfg.tenants[0].key_digests[0], <[u8; 32]>::from(Sha256::digest(b"sk-acme-1")));
    let ModelBackend::Upstream(up) = &cfg.models[0].backend else { panic!("upstream expected") };
    assert_eq!(up.api_key.as_ref().unwrap().expose(), "upstream-secret");
    assert_eq!(up.upstream_model, "mock");
    assert_eq!(cfg.store, StoreConfig::Memory { audit_max_len: 100_000 });
}

#[test]
fn no_file_gives_defaults() {
    let cfg = parse("").unwrap();
    assert_eq!(cfg.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(cfg.max_body_bytes, 4 * 1024 * 1024);
    assert!(cfg.tenants.is_empty());
    assert_eq!(cfg.models.len(), 1);
    assert_eq!(cfg.models[0].id, DEFAULT_MODEL_ID);
    assert!(matches!(&cfg.models[0].backend, ModelBackend::Engine(e) if e.path.is_none()));
}

#[test]
fn unknown_keys_name_their_path() {
    let err = parse("[[tenants]]\nid = \"a\"\napi_keys = [\"12345678\"]\napi_kyes = []\n").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("tenants[0]") && msg.contains("api_kyes"), "{msg}");
    let err = parse("lisen = \"x\"").unwrap_err().to_string();
    assert!(err.contains("lisen"), "{err}");
}

#[test]
fn wrong_types_and_values_name_their_path() {
    let err = parse("max_body_bytes = \"big\"").unwrap_err().to_string();
    assert!(err.starts_with("test.toml: max_body_bytes:"), "{err}");
    let err = parse("[[models]]\nid = \"m\"\nbackend = \"cloud\"\n").unwrap_err().to_string();
    assert!(err.contains("models[0].backend"), "{err}");
    let err = parse("[[models]]\nid = \"m\"\nbackend = \"upstream\"\n").unwrap_err().to_string();
    assert!(err.contains("models[0].base_url: required"), "{err}");
    let err = parse("listen = \"nowhere\"").unwrap_err().to_string();
    assert!(err.contains("listen: expected an address"), "{err}");
    let err = parse("[store]\nkind = \"redis\"\nurl = \"http://x\"").unwrap_err().to_string();
    assert!(err.contains("store.url"), "{err}");
}

#[test]
fn duplicates_are_rejected() {
    let two =
        "[[tenants]]\nid = \"a\"\napi_keys = [\"key-one-1\"]\n[[tenants]]\nid = \"a\"\napi_keys = [\"key-two-2\"]\n";
    assert!(parse(two).unwrap_err().to_string().contains("tenants[1].id: duplicate"));
    let shared =
        "[[tenants]]\nid = \"a\"\napi_keys = [\"key-one-1\"]\n[[tenants]]\nid = \"b\"\napi_keys = [\"key-one-1\"]\n";
    assert!(parse(shared).unwrap_err().to_string().contains("more than one tenant"));
}

#[test]
fn missing_upstream_key_variable_is_an_error() {
    let err = parse(CONTRACT).unwrap_err().to_string();
    assert!(err.contains("models[0].api_key_env: environment variable UPSTREAM_KEY is not set"), "{err}");
}

#[test]
fn hashed_keys_are_accepted_and_checked() {
    let digest = hex::encode(Sha256::digest(b"sk-hashed-key"));
    let cfg = parse(&format!("[[tenants]]\nid = \"h\"\napi_key_sha256 = [\"{digest}\"]\n")).unwrap();
    assert_eq!(hex::encode(cfg.tenants[0].key_digests[0]), digest);
    let err = parse("[[tenants]]\nid = \"h\"\napi_key_sha256 = [\"abc\"]\n").unwrap_err().to_string();
    assert!(err.contains("tenants[0].api_key_sha256[0]"), "{err}");
}

#[test]
fn environment_overrides_the_file() {
    let cfg = parse_env(
        CONTRACT,
        &[
            ("CROSSGUARD_LISTEN", "0.0.0.0:9999"),
            ("CROSSGUARD_STORE__KIND", "redis"),
            ("CROSSGUARD_STORE__URL", "redis://127.0.0.1:6380"),
            ("CROSSGUARD_MAX_BODY_BYTES", "2048"),
            ("CROSSGUARD_ADMIN_TOKEN", "ignored-here-it-is-a-secret"),
        ],
    )
    .unwrap();
    assert_eq!(cfg.listen.port(), 9999);
    let StoreConfig::Redis(redis) = &cfg.store else { panic!("redis expected") };
    assert_eq!(redis.url, "redis://127.0.0.1:6380");
    assert_eq!(redis.key_prefix, "crossguard:");
    assert_eq!(cfg.provenance.key, Some([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]));
    assert_eq!(cfg.max_body_bytes, 2048);
    let tenants = parse_env("", &[("CROSSGUARD_TENANTS", r#"[{id="t1", api_keys=["sk-t1-key-1"]}]"#)]).unwrap();
    assert_eq!(tenants.tenants[0].id, "t1");
    let err = parse_env("", &[("CROSSGUARD_LISTN", "x")]).unwrap_err().to_string();
    assert!(err.contains("CROSSGUARD_LISTN") && err.contains("listn"), "{err}");
}

#[test]
fn protection_keys_load_and_are_checked() {
    let text = r#"
[[tenants]]
id = "acme"
api_keys = ["sk-acme-1"]
fail_mode = "open"
canary = true
[provenance]
ngram_words = 6
ttl_secs = 3600
common_at = 4
foreign_tokens = false
[firewall]
read_encoded = false
[stats]
min_samples = 50
action = "block"
[canary]
text = "ref {canary} (secret)"
placement = "system_start"
"#;
    let cfg = parse(text).unwrap();
    assert_eq!(cfg.tenants[0].fail_mode, FailMode::Open);
    assert!(cfg.tenants[0].canary);
    assert_eq!((cfg.provenance.ngram_words, cfg.provenance.ttl_secs, cfg.provenance.common_at), (6, 3600, 4));
    assert_eq!(cfg.provenance.key, None);
    assert_eq!(cfg.stats.action, firewall::Action::Block);
    assert_eq!(cfg.canary.placement, CanaryPlacement::SystemStart);
    let defaults = parse("").unwrap();
    assert_eq!(defaults.provenance.ngram_words, 8);
    assert!(!cfg.provenance.foreign_tokens && defaults.provenance.foreign_tokens);
    assert!(!cfg.firewall.read_encoded && defaults.firewall.read_encoded);
    assert_eq!(defaults.stats.action, firewall::Action::Log);
    for (bad, key) in [
        ("[canary]\ntext = \"no placeholder\"", "canary.text"),
        ("[provenance]\nngram_words = 2", "provenance.ngram_words"),
        ("[provenance]\nmax_tenant_share = 0.0", "provenance.max_tenant_share"),
        ("[provenance]\nrefresh_interval_ms = 500\nmax_staleness_ms = 500", "provenance.max_staleness_ms"),
        ("[provenance]\nprovenance_unavailable = \"maybe\"", "provenance.provenance_unavailable"),
        ("[provenance]\nmax_tenant_share = 1.5", "provenance.max_tenant_share"),
        ("[provenance]\nmax_hashes = 1000\nmax_hashes_per_text = 2000", "provenance.max_hashes_per_text"),
        ("[responses]\nttl_secs = 0", "responses.ttl_secs"),
        ("[responses]\nmax_stored_bytes = 10", "responses.max_stored_bytes"),
        ("[responses]\nttl = 5", "responses"),
        ("[responses]\nmax_stored = 0", "responses.max_stored"),
        ("[store]\nkind = \"memory\"\nkey_prefix = \"x\"", "store.key_prefix"),
        ("[store]\nkind = \"redis\"", "provenance.key_env"),
        ("[stats]\nz_threshold = 0.5", "stats.z_threshold"),
        ("[firewall]\nread_encoded = \"yes\"", "read_encoded"),
    ] {
        let err = parse(bad).unwrap_err().to_string();
        assert!(err.contains(key), "{bad}: {err}");
    }
    let err = Config::from_parts("", "t", &[], &|n| (n == "CROSSGUARD_FINGERPRINT_KEY").then(|| "zz".to_owned()))
        .unwrap_err();
    assert!(err.to_string().contains("32 hexadecimal"), "{err}");
}

#[test]
fn the_rule_folder_watch_defaults_on_and_zero_turns_it_off() {
    assert_eq!(parse("").unwrap().firewall.watch_interval_ms, 1000);
    assert_eq!(parse("[firewall]\nwatch_interval_ms = 0").unwrap().firewall.watch_interval_ms, 0);
    assert_eq!(parse("[firewall]\nwatch_interval_ms = 250").unwrap().firewall.watch_interval_ms, 250);
    for bad in ["[firewall]\nwatch_interval_ms = 10", "[firewall]\nwatch_interval_ms = 86400000"] {
        let err = parse(bad).unwrap_err().to_string();
        assert!(err.contains("firewall.watch_interval_ms"), "{bad}: {err}");
    }
}

/// As the process would see it with `CROSSGUARD_ENABLE_FAULTS=1`.
fn parse_with_faults(text: &str) -> Result<Config, ConfigError> {
    Config::from_parts(text, "test.toml", &[], &|name| (name == ENABLE_FAULTS_ENV).then(|| "1".to_owned()))
}

#[test]
fn engine_kv_keys_and_fault_switches_load_and_are_checked() {
    let text = "[[models]]\nid = \"m\"\nbackend = \"engine\"\ndevice = \"auto\"\nkv_block_tokens = 32\n[models.fault]\nstale_kv = 0.5\nskip_owner_check = true\n";
    let cfg = parse_with_faults(text).unwrap();
    let ModelBackend::Engine(e) = &cfg.models[0].backend else { panic!("engine expected") };
    assert_eq!(e.kv_block_tokens, Some(32));
    assert_eq!(e.device, engine::Device::Auto);
    let err = parse_with_faults(&text.replace("\"auto\"", "\"gpu\"")).unwrap_err().to_string();
    assert!(err.contains("models[0].device: \"gpu\" is not a device"), "{err}");
    assert_eq!(e.fault.active(), ["stale_kv", "skip_owner_check"]);
    let defaults = parse("").unwrap();
    let ModelBackend::Engine(e) = &defaults.models[0].backend else { panic!("engine expected") };
    assert!(e.fault.active().is_empty(), "every defence is on by default");
    assert_eq!(e.device, engine::Device::Cpu);
    let err = parse_with_faults(&text.replace("0.5", "2.0")).unwrap_err().to_string();
    assert!(err.contains("models[0].fault.stale_kv: must be a probability"), "{err}");
    let err = parse_with_faults(&text.replace("32", "12")).unwrap_err().to_string();
    assert!(err.contains("models[0].kv_block_tokens: must be a power of two"), "{err}");
    let err = parse_with_faults(&text.replace("skip_owner_check", "skip_owner_chek")).unwrap_err().to_string();
    assert!(err.contains("skip_owner_chek"), "{err}");
    let upstream = "[[models]]\nid = \"m\"\nbackend = \"upstream\"\nbase_url = \"http://127.0.0.1:1/v1\"\n[models.fault]\nskip_zero_fill = true\n";
    let err = parse(upstream).unwrap_err().to_string();
    assert!(err.contains("models[0].fault: only allowed with backend = \"engine\""), "{err}");
}

#[test]
fn itl_target_defaults_on_and_zero_turns_it_off() {
    let engine = |text: &str| match parse(text).map(|c| c.models.into_iter().next().map(|m| m.backend)) {
        Ok(Some(ModelBackend::Engine(e))) => Ok(e.batching.itl_target),
        Ok(_) => panic!("engine expected"),
        Err(e) => Err(e.to_string()),
    };
    let model = "[[models]]\nid = \"m\"\nbackend = \"engine\"\n";
    assert_eq!(engine(model), Ok(engine::SchedulerConfig::default().itl_target));
    assert_eq!(engine(&format!("{model}itl_target_ms = 50\n")), Ok(Some(Duration::from_millis(50))));
    assert_eq!(engine(&format!("{model}itl_target_ms = 0\n")), Ok(None));
    let err = engine(&format!("{model}itl_target_ms = 90000\n")).unwrap_err();
    assert!(err.contains("models[0].itl_target_ms: must be between 0 (off) and 60000"), "{err}");
    let err = parse(
        "[[models]]\nid = \"m\"\nbackend = \"upstream\"\nbase_url = \"http://127.0.0.1:1/v1\"\nitl_target_ms = 50\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("models[0].itl_target_ms: only allowed with backend = \"engine\""), "{err}");
}

#[test]
fn stream_limits_default_and_are_checked() {
    let streams = |text: &str| match parse(text).map(|c| c.models.into_iter().next().map(|m| m.backend)) {
        Ok(Some(ModelBackend::Engine(e))) => Ok(e.streams),
        Ok(_) => panic!("engine expected"),
        Err(e) => Err(e.to_string()),
    };
    let model = "[[models]]\nid = \"m\"\nbackend = \"engine\"\n";
    let defaults = crate::backend::engine_client::StreamLimits::default();
    assert_eq!(streams(model), Ok(defaults));
    assert_eq!((defaults.buffer_events, defaults.stall), (256, Duration::from_secs(30)));
    let set = streams(&format!("{model}stream_buffer_events = 8\nstream_stall_ms = 500\n")).unwrap();
    assert_eq!((set.buffer_events, set.stall), (8, Duration::from_millis(500)));
    let err = streams(&format!("{model}stream_buffer_events = 0\n")).unwrap_err();
    assert!(err.contains("models[0].stream_buffer_events: must be between 1 and 65536, got 0"), "{err}");
    let err = streams(&format!("{model}stream_stall_ms = 0\n")).unwrap_err();
    assert!(err.contains("models[0].stream_stall_ms: must be between 1 and 3600000, got 0"), "{err}");
    let err = parse(
        "[[models]]\nid = \"m\"\nbackend = \"upstream\"\nbase_url = \"http://127.0.0.1:1/v1\"\nstream_stall_ms = 50\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("models[0].stream_stall_ms: only allowed with backend = \"engine\""), "{err}");
}

#[test]
fn secrets_do_not_debug_print() {
    let cfg = parse("admin_token = \"0123456789abcdef-admin\"").unwrap();
    assert!(!format!("{cfg:?}").contains("0123456789abcdef"));
    assert!(parse("admin_token = \"short\"").is_err());
    let text = "metrics_token = \"metrics-zq81-token\"\n[store]\nkind = \"redis\"\nurl = \"redis://:pw-zq81-redis@127.0.0.1:6379\"\n\
                [[models]]\nid = \"m\"\nbackend = \"upstream\"\nbase_url = \"http://u:pw-zq81-base@127.0.0.1:1/v1\"\napi_key_env = \"UPSTREAM_KEY\"\n";
    let cfg = parse_env(text, &[]).unwrap();
    let shown = format!("{cfg:?}");
    // The fingerprint key is 00 01 02 ...: as bytes in Debug it would read "[0, 1, 2".
    for secret in ["zq81", "upstream-secret", "[0, 1, 2", "000102"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}

#[test]
fn the_firewall_simd_cap_is_not_a_config_key() {
    // The firewall reads it itself; the overlay must not take it for `firewall_simd`.
    assert!(parse_env("", &[(firewall::SIMD_ENV, "avx2")]).is_ok());
}

#[test]
fn faults_need_the_enabling_variable() {
    let text = "[[models]]\nid = \"m\"\nbackend = \"engine\"\n[models.fault]\nskip_zero_fill = true\n";
    let err = parse(text).unwrap_err().to_string();
    assert!(err.contains("models[0].fault:") && err.contains("CROSSGUARD_ENABLE_FAULTS=1"), "{err}");
    let empty_table = parse("[[models]]\nid = \"m\"\nbackend = \"engine\"\n[models.fault]\n").unwrap_err().to_string();
    assert!(empty_table.contains("CROSSGUARD_ENABLE_FAULTS=1"), "{empty_table}");
    let other_value = Config::from_parts(text, "t", &[], &|n| (n == ENABLE_FAULTS_ENV).then(|| "true".to_owned()));
    assert!(other_value.is_err(), "only 1 enables");
    assert!(parse_with_faults(text).is_ok());
    // A config key of the same name does not enable them: the variable is reserved.
    let err = parse_env(text, &[("CROSSGUARD_ENABLE_FAULTS", "1")]).unwrap_err().to_string();
    assert!(err.contains("models[0].fault:"), "{err}");
    assert!(parse(&format!("enable_faults = true\n{text}")).is_err());
}

#[test]
fn open_mode_off_loopback_needs_allow_open() {
    for listen in ["0.0.0.0:8080", "192.0.2.10:8080", "[::]:8080"] {
        let err = parse(&format!("listen = \"{listen}\"")).unwrap_err().to_string();
        assert!(err.contains("allow_open") && err.contains(listen), "{err}");
        assert!(parse(&format!("listen = \"{listen}\"\nallow_open = true")).unwrap().allow_open);
        let with_tenant = format!("listen = \"{listen}\"\n[[tenants]]\nid = \"a\"\napi_keys = [\"sk-key-123\"]\n");
        assert!(parse(&with_tenant).is_ok());
    }
    for listen in ["127.0.0.1:8080", "127.0.0.2:1", "[::1]:8080"] {
        assert!(parse(&format!("listen = \"{listen}\"")).is_ok(), "{listen}");
    }
}

#[test]
fn metrics_token_comes_from_the_file_or_a_variable() {
    assert_eq!(parse("").unwrap().metrics_token, None);
    let literal = parse("metrics_token = \"0123456789abcdef-metrics\"").unwrap();
    assert_eq!(literal.metrics_token.as_ref().map(Secret::expose), Some("0123456789abcdef-metrics"));
    let from_env = |text: &str| {
        Config::from_parts(text, "t", &[], &|n| match n {
            "CROSSGUARD_METRICS_TOKEN" => Some("default-variable-token".to_owned()),
            "MY_METRICS" => Some("named-variable-token".to_owned()),
            _ => None,
        })
    };
    assert_eq!(
        from_env("").unwrap().metrics_token.map(|s| s.expose().to_owned()).as_deref(),
        Some("default-variable-token")
    );
    let named = from_env("metrics_token_env = \"MY_METRICS\"").unwrap().metrics_token;
    assert_eq!(named.as_ref().map(Secret::expose), Some("named-variable-token"));
    for (bad, message) in [
        ("metrics_token = \"short\"", "metrics_token: must be at least 16"),
        (
            "metrics_token = \"0123456789abcdef-m\"\nmetrics_token_env = \"X\"",
            "metrics_token: set metrics_token or metrics_token_env, not both",
        ),
    ] {
        let err = parse(bad).unwrap_err().to_string();
        assert!(err.contains(message), "{err}");
    }
}

#[test]
fn admin_throttle_defaults_and_bounds() {
    assert_eq!(
        parse("").unwrap().admin_throttle,
        AdminThrottleConfig { client_failures: 5, global_failures: 50, window_secs: 300, cooldown_secs: 300 }
    );
    let set =
        parse("[admin_throttle]\nclient_failures = 3\nglobal_failures = 9\nwindow_secs = 60\ncooldown_secs = 30\n")
            .unwrap();
    assert_eq!((set.admin_throttle.client_failures, set.admin_throttle.cooldown_secs), (3, 30));
    for (bad, key) in [
        ("[admin_throttle]\nclient_failures = 0", "admin_throttle.client_failures"),
        ("[admin_throttle]\nwindow_secs = 0", "admin_throttle.window_secs"),
        ("[admin_throttle]\nclient_failures = 10\nglobal_failures = 5", "admin_throttle.global_failures"),
        ("[admin_throttle]\ncooldown_secs = 100000", "admin_throttle.cooldown_secs"),
        ("[admin_throttle]\nclient_failure = 3", "client_failure"),
    ] {
        let err = parse(bad).unwrap_err().to_string();
        assert!(err.contains(key), "{bad}: {err}");
    }
}
