//! What a JSON text will cost once parsed, counted from its bytes before anything parses it.
//!
//! A parsed JSON value costs tens of bytes of memory, and an object or array hundreds once the
//! request's copies of it are counted, whatever their text's length: a body of tiny objects
//! (`{"a":0},…`, a few bytes each) grows fifty- to a hundredfold on its way through a request,
//! where real transcript entries (some 30 bytes a value and 200 a container) grow some
//! sevenfold. [`Weight::parsed_bytes`] estimates that cost from the counts, and a request's
//! budget is charged for it ([`within`] refuses a text whose cost alone passes a bound).
//! Whitespace between tokens is not counted: padding buys nothing.

/// Memory a parsed value takes, its share of a request's copies included (measured on the
/// release build: appends and normalizations of arrays of numbers, of short strings, of tiny
/// objects and of real entries, against these counts; the largest of each, rounded up).
pub const VALUE_BYTES: usize = 256;

/// Memory a parsed object or array takes beyond its values: its map or vector, their growth,
/// and the request's copies of them (measured as [`VALUE_BYTES`]).
pub const CONTAINER_BYTES: usize = 384;

/// The most a text may take once parsed unless the caller says otherwise: the default budget
/// of request bodies held at once.
pub const DEFAULT_MAX_PARSED_BYTES: usize = 1024 * 1024 * 1024;

/// What a JSON text holds, counted from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Weight {
    /// Bytes other than whitespace between tokens.
    pub bytes: usize,
    /// Every object, array, member and element, the top value included.
    pub values: usize,
    /// Objects and arrays.
    pub containers: usize,
}

impl Weight {
    /// About the memory the text takes once parsed, as [`VALUE_BYTES`] and [`CONTAINER_BYTES`]
    /// count it.
    pub fn parsed_bytes(&self) -> usize {
        self.bytes
            .saturating_add(self.values.saturating_mul(VALUE_BYTES))
            .saturating_add(self.containers.saturating_mul(CONTAINER_BYTES))
    }
}

/// Whitespace between JSON tokens.
pub fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Where a byte of JSON text falls, its strings told apart from the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteIn {
    /// Outside strings: a bracket, a comma, a colon, a byte of a number or literal.
    Token,
    /// Whitespace between tokens.
    Space,
    /// The quote that opens a string.
    Opens,
    /// Inside a string (an escaped quote included).
    String,
    /// The quote that closes a string.
    Closes,
}

/// Reads JSON text a byte at a time, telling the bytes of its strings from the rest without
/// reading what the strings say.
#[derive(Debug, Clone, Copy, Default)]
pub struct StringScan {
    in_string: bool,
    escaped: bool,
}

impl StringScan {
    pub fn next(&mut self, byte: u8) -> ByteIn {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if byte == b'\\' {
                self.escaped = true;
            } else if byte == b'"' {
                self.in_string = false;
                return ByteIn::Closes;
            }
            ByteIn::String
        } else if is_json_space(byte) {
            ByteIn::Space
        } else if byte == b'"' {
            self.in_string = true;
            ByteIn::Opens
        } else {
            ByteIn::Token
        }
    }
}

/// The weight of `json`. Text that is not JSON is counted as if it were (the parser refuses it
/// later); strings are skipped without being read.
pub fn weigh(json: &[u8]) -> Weight {
    let mut weight = Weight::default();
    let mut scan = StringScan::default();
    // Just after `[` or `{`: the next token other than whitespace opens a first element, unless
    // it closes the container.
    let mut opened = false;
    for &byte in json {
        match scan.next(byte) {
            ByteIn::Space => continue,
            ByteIn::String | ByteIn::Closes => {
                weight.bytes += 1;
                continue;
            }
            ByteIn::Opens | ByteIn::Token => {}
        }
        if weight.bytes == 0 {
            weight.values += 1;
        }
        weight.bytes += 1;
        if opened && !matches!(byte, b']' | b'}') {
            weight.values += 1;
        }
        opened = false;
        match byte {
            b'[' | b'{' => {
                opened = true;
                weight.containers += 1;
            }
            b',' => weight.values += 1,
            _ => {}
        }
    }
    weight
}

/// Why a text is refused: what it holds, and what it would take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooHeavy {
    pub weight: Weight,
    pub max_parsed_bytes: usize,
}

impl std::fmt::Display for TooHeavy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = &self.weight;
        write!(
            f,
            "{} JSON values, {} of them objects or arrays, in {} bytes: about {} bytes once \
             parsed, more than the {} one request may take",
            w.values,
            w.containers,
            w.bytes,
            w.parsed_bytes(),
            self.max_parsed_bytes
        )
    }
}

/// The text's weight, or why it would take more than `max_parsed_bytes` once parsed.
pub fn within(json: &[u8], max_parsed_bytes: usize) -> Result<Weight, TooHeavy> {
    let weight = weigh(json);
    if weight.parsed_bytes() > max_parsed_bytes {
        return Err(TooHeavy {
            weight,
            max_parsed_bytes,
        });
    }
    Ok(weight)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values a parser builds: containers, their elements and members, scalars.
    fn parsed_values(value: &serde_json::Value) -> usize {
        1 + match value {
            serde_json::Value::Array(items) => items.iter().map(parsed_values).sum(),
            serde_json::Value::Object(members) => members.values().map(parsed_values).sum(),
            _ => 0,
        }
    }

    #[test]
    fn the_count_is_what_a_parser_builds() {
        for text in [
            "1",
            "\"a,[b]{c}\"",
            "[]",
            "{}",
            "[[]]",
            "[ [ ] , { } , 1 ]",
            r#"{"a":[1,2,{"b":"x\"],"}],"c":null}"#,
            r#"[{"k\\":"v"},"\\",[[[]]]]"#,
            "\n[\t1 ,\r2 ]\n",
        ] {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(
                weigh(text.as_bytes()).values,
                parsed_values(&value),
                "{text}"
            );
        }
        assert_eq!(weigh(b"").values, 0);
        assert_eq!(weigh(b"  ").values, 0);
    }

    #[test]
    fn dense_texts_weigh_more_than_real_ones_of_their_length() {
        const MIB: usize = 1024 * 1024;
        // Small objects padded with whitespace: the padding buys nothing.
        let objects = format!("[{}{{}}]", "{\"abcdefghi\":0},         ".repeat(200_000));
        let refused = within(objects.as_bytes(), 32 * MIB).unwrap_err();
        assert_eq!(refused.weight.containers, 200_002);
        assert_eq!(refused.weight.bytes, 16 * 200_000 + 4);
        assert!(refused.to_string().contains("once parsed"), "{refused}");
        // Numbers cost as much as any value: two bytes of text each.
        let numbers = format!("[{}0]", "0,".repeat(5_000_000));
        let refused_numbers = within(numbers.as_bytes(), DEFAULT_MAX_PARSED_BYTES).unwrap_err();
        assert_eq!(refused_numbers.weight.values, 5_000_002);
        // Real entries of a few times the size pass.
        let line = r#"{"parentUuid":"9f1c2a4e-0b7d-4c55-8e3a-5d2f7b9c1e08","isSidechain":false,"userType":"external","cwd":"/work/app","sessionId":"6a0e8f3b-2d41-4f7c-9b15-0c8e4d2a7f63","version":"2.0.14","gitBranch":"main","type":"assistant","message":{"id":"msg_01XYZ","type":"message","role":"assistant","model":"claude-opus-5","content":[{"type":"text","text":"I'll run the tests now and report what fails."}],"stop_reason":"end_turn","usage":{"input_tokens":1520,"output_tokens":42}},"uuid":"1b2c3d4e-5f60-4718-9a0b-c1d2e3f40516","timestamp":"2026-12-03T10:00:00.000Z"}"#;
        let real = format!("[{}]", vec![line; 20_000].join(","));
        assert!(real.len() > 3 * refused.weight.bytes, "{}", real.len());
        let weight = within(real.as_bytes(), DEFAULT_MAX_PARSED_BYTES).unwrap();
        // Per byte of text, the tiny objects cost over three times what real entries do.
        let per_byte = |w: &Weight| w.parsed_bytes() as f64 / w.bytes as f64;
        assert!(
            per_byte(&refused.weight) > 3.0 * per_byte(&weight),
            "{weight:?} {:?}",
            refused.weight
        );
    }
}
