//! The embedded deployment's fingerprint key, made on first start and kept owner-only. A
//! shared store's replicas are given theirs in `provenance.key` instead: they must agree.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::ProtectionError;

/// The embedded deployment's fingerprint key: read from `path`, created (random, owner
/// read-only) on first start.
pub(super) fn local_key(path: &Path) -> Result<[u8; 16], ProtectionError> {
    let err = |reason: String| ProtectionError::Key { path: path.display().to_string(), reason };
    match std::fs::read_to_string(path) {
        Ok(text) => hex::decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .ok_or_else(|| err("does not hold 32 hexadecimal characters; delete it to make a new key".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create its folder: {e}")))?;
            }
            // Two v4 UUIDs hold 244 random bits (OS-seeded); hashing them gives 128 uniform ones.
            let digest = Sha256::new()
                .chain_update(uuid::Uuid::new_v4().as_bytes())
                .chain_update(uuid::Uuid::new_v4().as_bytes())
                .finalize();
            let mut key = [0u8; 16];
            key.copy_from_slice(&digest[..16]);
            write_private(path, &hex::encode(key)).map_err(|e| err(format!("cannot write: {e}")))?;
            Ok(key)
        }
        Err(e) => Err(err(format!("cannot read: {e}"))),
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_key_is_made_once_and_kept_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/fingerprint.key");
        let first = local_key(&path).unwrap();
        assert_eq!(first, local_key(&path).unwrap());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        std::fs::write(&path, "nope").unwrap();
        assert!(local_key(&path).unwrap_err().to_string().contains("32 hexadecimal"));
    }
}
