//! The keys of a safetensors header's top-level JSON object, read once to
//! name a tensor given twice: a JSON map keeps only the last entry of a
//! name, and the offsets left then read as a hole, not as a duplicate.

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The first top-level key `json` holds twice, if any (`None` too when
/// `json` is no object).
pub(crate) fn duplicate_name(json: &[u8]) -> Option<String> {
    serde_json::from_slice::<FirstDuplicate>(json).ok()?.0
}

struct FirstDuplicate(Option<String>);

impl<'de> Deserialize<'de> for FirstDuplicate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(KeysVisitor)
    }
}

struct KeysVisitor;

impl<'de> Visitor<'de> for KeysVisitor {
    type Value = FirstDuplicate;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FirstDuplicate, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            map.next_value::<IgnoredAny>()?;
            if !seen.insert(key.clone()) {
                return Ok(FirstDuplicate(Some(key)));
            }
        }
        Ok(FirstDuplicate(None))
    }
}

#[cfg(test)]
mod tests {
    use super::duplicate_name;

    #[test]
    fn the_first_key_given_twice_is_found() {
        assert_eq!(
            duplicate_name(br#"{"a":1,"b":{"a":2},"b":3}"#),
            Some("b".into())
        );
        assert_eq!(duplicate_name(br#"{"a":1,"b":{"a":2}}"#), None);
        assert_eq!(duplicate_name(b"[1]"), None);
    }
}
