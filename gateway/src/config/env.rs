//! The environment overlay: `CROSSGUARD_*` variables applied onto the parsed file before
//! it is read (see the module doc of [`super`] for the naming rules).

use super::{ConfigError, RESERVED_ENV};

/// Applies `CROSSGUARD_*` variables onto `table`; returns (top-level key, variable) pairs.
pub(super) fn overlay_env(
    table: &mut toml::Table,
    env: &[(String, String)],
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut applied = Vec::new();
    for (name, value) in env {
        let Some(rest) = name.strip_prefix("CROSSGUARD_") else { continue };
        if RESERVED_ENV.contains(&name.as_str()) || rest.is_empty() {
            continue;
        }
        let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        let parsed = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.clone()));
        let mut cursor = &mut *table;
        for (i, key) in path.iter().enumerate() {
            if i + 1 == path.len() {
                cursor.insert(key.clone(), parsed.clone());
                break;
            }
            let entry = cursor.entry(key.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            cursor = match entry {
                toml::Value::Table(t) => t,
                _ => {
                    return Err(ConfigError::Invalid {
                        origin: name.clone(),
                        key: path[..=i].join("."),
                        message: "is not a table, cannot set a key inside it".into(),
                    })
                }
            };
        }
        applied.push((path[0].clone(), name.clone()));
    }
    Ok(applied)
}
