//! How many values a JSON text holds, counted from its bytes before anything parses it.
//!
//! A parsed JSON value costs a couple of hundred bytes of memory whatever its text's length, so
//! a body of empty arrays (`[[],[],…]`, two bytes a value) grows a hundredfold when parsed, where
//! real entries (about 15 to 20 bytes a value) grow some twentyfold. [`within_bounds`] refuses a
//! text denser in values than [`BYTES_PER_VALUE`] allows beyond a floor, so no body or entry costs
//! more memory to read than a real one of the same length.

/// Values any text may hold, whatever its length.
pub const VALUE_FLOOR: usize = 100_000;

/// Bytes of text each value past the floor needs: half of what real entries spend.
pub const BYTES_PER_VALUE: usize = 8;

/// The most values a text of `bytes` bytes may hold.
pub fn value_allowance(bytes: usize) -> usize {
    VALUE_FLOOR + bytes / BYTES_PER_VALUE
}

/// The values in `json`: every object, array, member and element, the top value included, as
/// a parser would build them. Text that is not JSON is counted as if it were (it is refused by
/// the parser later); strings are skipped without being read.
pub fn count_values(json: &[u8]) -> usize {
    let mut values = 0usize;
    let (mut in_string, mut escaped) = (false, false);
    // Just after `[` or `{`: the next token other than whitespace opens a first element, unless
    // it closes the container.
    let mut opened = false;
    let mut any = false;
    for &byte in json {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        if !any {
            any = true;
            values += 1;
        }
        if opened && !matches!(byte, b']' | b'}') {
            values += 1;
        }
        opened = false;
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => opened = true,
            b',' => values += 1,
            _ => {}
        }
    }
    values
}

/// `Err((values, allowance))` when `json` holds more values than its length allows.
pub fn within_bounds(json: &[u8]) -> Result<(), (usize, usize)> {
    let allowance = value_allowance(json.len());
    // Most texts are far below the floor however they are counted: a byte is at most a value.
    if json.len() <= VALUE_FLOOR {
        return Ok(());
    }
    match count_values(json) {
        values if values > allowance => Err((values, allowance)),
        _ => Ok(()),
    }
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
                count_values(text.as_bytes()),
                parsed_values(&value),
                "{text}"
            );
        }
        assert_eq!(count_values(b""), 0);
        assert_eq!(count_values(b"  "), 0);
    }

    #[test]
    fn dense_texts_are_refused_and_real_ones_pass() {
        let empty_arrays = format!("[{}[]]", "[],".repeat(200_000));
        let (values, allowance) = within_bounds(empty_arrays.as_bytes()).unwrap_err();
        assert_eq!(values, 200_002);
        assert_eq!(allowance, value_allowance(empty_arrays.len()));
        let words: Vec<_> = (0..200_000)
            .map(|i| serde_json::json!({"type": "text", "text": format!("word {i}")}))
            .collect();
        let real = serde_json::to_vec(&words).unwrap();
        assert!(count_values(&real) > VALUE_FLOOR);
        assert_eq!(within_bounds(&real), Ok(()));
        // Below the floor anything goes.
        assert_eq!(within_bounds("[[],".repeat(1_000).as_bytes()), Ok(()));
    }
}
