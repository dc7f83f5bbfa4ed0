//! GGUF metadata: typed key/value pairs and checked accessors.
//!
//! Values are owned (they are small next to the tensor data, and owning them keeps
//! [`Metadata`] free of the file's lifetime). Accessors convert between integer widths
//! only when the value fits, and every failure is an [`Error::Metadata`] naming the key.

use std::collections::HashMap;

use crate::{Error, Result};

/// One metadata value, as typed in the file.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The value as an `i128` when it is an integer of any width.
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }
}

/// All metadata of one GGUF file, in file order, with lookup by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds an entry; a key seen twice is an error (the file would be ambiguous).
    pub(super) fn insert(&mut self, key: String, value: MetaValue) -> std::result::Result<(), String> {
        if self.index.contains_key(&key) {
            return Err(format!("metadata key {key} appears twice"));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).and_then(|&i| self.entries.get(i)).map(|(_, v)| v)
    }

    /// All entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn require(&self, key: &str) -> Result<&MetaValue> {
        self.get(key).ok_or_else(|| error(key, "missing"))
    }

    /// An integer of any width whose value fits in `u32`.
    pub fn u32(&self, key: &str) -> Result<u32> {
        integer(key, self.require(key)?)
    }

    /// An integer of any width whose value fits in `u64`.
    pub fn u64(&self, key: &str) -> Result<u64> {
        integer(key, self.require(key)?)
    }

    /// A float (`f32`, or `f64` narrowed).
    pub fn f32(&self, key: &str) -> Result<f32> {
        match *self.require(key)? {
            MetaValue::F32(v) => Ok(v),
            #[allow(clippy::cast_possible_truncation)] // narrowing is the point
            MetaValue::F64(v) => Ok(v as f32),
            ref other => Err(wrong_type(key, "a float", other)),
        }
    }

    /// A boolean.
    pub fn bool(&self, key: &str) -> Result<bool> {
        match *self.require(key)? {
            MetaValue::Bool(v) => Ok(v),
            ref other => Err(wrong_type(key, "a bool", other)),
        }
    }

    /// A string.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            MetaValue::String(s) => Ok(s),
            other => Err(wrong_type(key, "a string", other)),
        }
    }

    fn array(&self, key: &str) -> Result<&[MetaValue]> {
        match self.require(key)? {
            MetaValue::Array(items) => Ok(items),
            other => Err(wrong_type(key, "an array", other)),
        }
    }

    /// An array of strings.
    pub fn string_array(&self, key: &str) -> Result<Vec<&str>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                MetaValue::String(s) => Ok(s.as_str()),
                other => Err(error(key, &format!("element {i} is {}, not a string", other.type_name()))),
            })
            .collect()
    }

    /// An array of integers that all fit in `i32`.
    pub fn i32_array(&self, key: &str) -> Result<Vec<i32>> {
        let items = self.array(key)?;
        items.iter().map(|v| integer(key, v)).collect()
    }

    /// An array of floats (f32, or f64 narrowed).
    pub fn f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                MetaValue::F32(x) => Ok(*x),
                MetaValue::F64(x) => Ok(*x as f32),
                other => Err(error(key, &format!("element {i} is {}, not a float", other.type_name()))),
            })
            .collect()
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.str("general.architecture")
    }
}

fn error(key: &str, reason: &str) -> Error {
    Error::Metadata { key: key.to_owned(), reason: reason.to_owned() }
}

fn wrong_type(key: &str, wanted: &str, got: &MetaValue) -> Error {
    error(key, &format!("expected {wanted}, found {}", got.type_name()))
}

fn integer<T: TryFrom<i128> + Copy>(key: &str, value: &MetaValue) -> Result<T> {
    let v = value.as_integer().ok_or_else(|| wrong_type(key, "an integer", value))?;
    T::try_from(v).map_err(|_| error(key, &format!("value {v} is out of range for {}", std::any::type_name::<T>())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metadata {
        let mut m = Metadata::default();
        m.insert("a.u8".into(), MetaValue::U8(7)).unwrap();
        m.insert("a.neg".into(), MetaValue::I32(-1)).unwrap();
        m.insert("a.big".into(), MetaValue::U64(1 << 40)).unwrap();
        m.insert("a.f64".into(), MetaValue::F64(0.5)).unwrap();
        m.insert("a.s".into(), MetaValue::String("x".into())).unwrap();
        let arr = vec![MetaValue::String("p".into()), MetaValue::U8(1)];
        m.insert("a.mixed".into(), MetaValue::Array(arr)).unwrap();
        m
    }

    #[test]
    fn integers_convert_only_when_they_fit() {
        let m = sample();
        assert_eq!(m.u32("a.u8").unwrap(), 7);
        assert_eq!(m.u64("a.big").unwrap(), 1 << 40);
        let err = m.u32("a.big").unwrap_err().to_string();
        assert!(err.contains("a.big") && err.contains("out of range"), "{err}");
        assert!(m.u32("a.neg").is_err());
        assert!(m.u32("a.s").unwrap_err().to_string().contains("found string"));
    }

    #[test]
    fn missing_keys_and_wrong_types_name_the_key() {
        let m = sample();
        assert_eq!(m.f32("a.f64").unwrap(), 0.5);
        let err = m.str("nope").unwrap_err().to_string();
        assert_eq!(err, "GGUF metadata nope: missing");
        let err = m.string_array("a.mixed").unwrap_err().to_string();
        assert!(err.contains("element 1 is u8"), "{err}");
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        let mut m = sample();
        assert!(m.insert("a.s".into(), MetaValue::Bool(true)).is_err());
    }
}
