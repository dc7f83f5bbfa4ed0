//! The process's log: `tracing` to stderr, filtered by `CROSSGUARD_LOG` (default `info`),
//! JSON with `CROSSGUARD_LOG_FORMAT=json`; and a panic hook that logs where a panic
//! happened but never its message, which can hold request text (a value formatted into an
//! assertion, an index, a string slice).
//!
//! What the rest of the gateway may put in a log line is [`crate::redact`]'s business.

/// Installs the subscriber and the panic hook; call once, first thing in `main`.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CROSSGUARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if std::env::var("CROSSGUARD_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
    std::panic::set_hook(Box::new(log_panic));
}

/// The panic hook: file, line and thread; the payload only as its length.
pub fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let location = info.location().map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column())).unwrap_or_default();
    let payload_bytes = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| s.len())
        .or_else(|| info.payload().downcast_ref::<String>().map(String::len))
        .unwrap_or(0);
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("unnamed");
    tracing::error!(location, thread, payload_bytes, "panic (its message is withheld: it may hold request text)");
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// Log output collected in memory.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_panic_is_logged_without_its_message() {
        const THREAD: &str = "panic-log-test";
        // The hook is process-wide: other threads keep the previous one.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(THREAD) {
                super::log_panic(info)
            } else {
                previous(info)
            }
        }));
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt().json().with_writer(move || writer.clone()).finish();
        let joined = std::thread::Builder::new()
            .name(THREAD.into())
            .spawn(move || {
                tracing::subscriber::with_default(subscriber, || panic!("prompt was: {}", "zq-secret-prompt"))
            })
            .map(|h| h.join());
        assert!(matches!(joined, Ok(Err(_))), "the thread panicked");
        let log = String::from_utf8_lossy(&sink.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
        assert!(log.contains("panic (its message is withheld") && log.contains("logging.rs:"), "{log}");
        assert!(!log.contains("zq-secret") && !log.contains("prompt was"), "{log}");
    }
}
