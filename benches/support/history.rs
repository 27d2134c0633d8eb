//! A deterministic, realistic agent-loop history for the benchmarks (no `rand`: a 64-bit LCG).
//!
//! Shape of one user turn, as an agent loop writes it: an optional attachment, the prompt, then
//! 1–4 steps of {assistant response streamed as one entry per content block (signed thinking,
//! text, 1–2 tool_use, all sharing `message.id`), progress events, one `tool_result` user entry
//! per tool_use (outputs from tens of bytes to 3 KB, a tenth of them multi-KB, some `is_error`)},
//! then a final assistant text and, now and then, a system entry. No compact boundary, so
//! normalization sees the whole history. 10,000 entries come to about 5.7 MB of JSON.
#![allow(dead_code)]

use serde_json::{json, Value};

/// Knuth's MMIX LCG; the high bits are used.
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Lcg(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u32() as usize) % (hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.next_u32() % 100 < percent
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.range(0, items.len() - 1)]
    }
}

const WORDS: &[&str] = &[
    "the",
    "function",
    "returns",
    "a",
    "value",
    "when",
    "error",
    "thread",
    "message",
    "we",
    "should",
    "check",
    "whether",
    "this",
    "test",
    "fails",
    "because",
    "of",
    "config",
    "database",
    "request",
    "handler",
    "cache",
    "index",
    "after",
    "before",
    "update",
    "field",
    "struct",
    "module",
    "let",
    "me",
    "look",
    "at",
    "file",
    "and",
    "then",
    "run",
    "build",
    "again",
    "it",
    "seems",
    "that",
    "timeout",
    "retry",
    "append",
    "page",
    "query",
    "schema",
    "migration",
];

const FILES: &[&str] = &[
    "src/store/messages.rs",
    "src/http/mod.rs",
    "src/history/normalize/merge.rs",
    "tests/conformance.rs",
    "Cargo.toml",
    "src/cli.rs",
    "README.md",
];

/// Prose of about `len` bytes.
pub fn prose(rng: &mut Lcg, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        if !s.is_empty() {
            s.push(if rng.chance(8) { '\n' } else { ' ' });
        }
        s.push_str(rng.pick(WORDS));
        if rng.chance(7) {
            s.push('.');
        }
    }
    s
}

/// Tool output (source listings, grep hits, build logs) of about `len` bytes.
pub fn tool_output(rng: &mut Lcg, len: usize) -> String {
    let mut s = String::with_capacity(len + 120);
    let file = rng.pick(FILES);
    let mut line = rng.range(1, 400);
    while s.len() < len {
        let indent = "    ".repeat(rng.range(0, 3));
        let words = rng.range(3, 10);
        let mut code = String::new();
        for i in 0..words {
            if i > 0 {
                code.push(' ');
            }
            code.push_str(rng.pick(WORDS));
        }
        s.push_str(&format!(
            "{file}:{line}:{indent}let {} = {}(\"{code}\");\n",
            rng.pick(WORDS),
            rng.pick(WORDS)
        ));
        line += 1;
    }
    s
}

/// Base64-looking signature of `len` bytes.
fn signature(rng: &mut Lcg, len: usize) -> String {
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    (0..len)
        .map(|_| B64[(rng.next_u32() % 64) as usize] as char)
        .collect()
}

struct Gen {
    rng: Lcg,
    out: Vec<Value>,
    n: usize,
    responses: usize,
    tools: usize,
}

impl Gen {
    fn push(&mut self, mut entry: Value) {
        let seq = self.out.len();
        let uuid = format!("0190a1b2-0000-7000-8000-{seq:012}");
        let obj = entry.as_object_mut().unwrap();
        obj.insert("seq".into(), json!(seq));
        obj.insert("uuid".into(), json!(uuid));
        obj.insert(
            "created_at".into(),
            json!(format!(
                "2025-06-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                1 + (seq / 86_400) % 28,
                (seq / 3600) % 24,
                (seq / 60) % 60,
                seq % 60,
                seq % 1000
            )),
        );
        self.out.push(entry);
    }

    fn full(&self) -> bool {
        self.out.len() >= self.n
    }

    /// One streamed fragment; only the one that ends the response carries `stop_reason` and
    /// `usage`.
    fn assistant(&mut self, id: &str, block: Value, stop: Option<&str>) {
        let mut message = json!({"role": "assistant", "id": id, "model": "claude-sonnet-4-5",
            "content": [block]});
        if let Some(stop) = stop {
            let output_tokens = self.rng.range(5, 900);
            message["stop_reason"] = json!(stop);
            message["usage"] = json!({"input_tokens": 4, "cache_read_input_tokens": 31_000,
                "cache_creation_input_tokens": 512, "output_tokens": output_tokens});
        }
        self.push(json!({"type": "assistant", "message": message}));
    }

    fn turn(&mut self) {
        let rng = &mut self.rng;
        if rng.chance(10) {
            let len = rng.range(200, 1000);
            let file = rng.pick(FILES);
            let text = format!("Contents of {file}:\n{}", tool_output(rng, len));
            self.push(json!({"type": "attachment", "is_meta": true,
                "message": {"role": "user", "content": [{"type": "text", "text": text}]}}));
        }
        let len = self.rng.range(30, 300);
        let prompt = prose(&mut self.rng, len);
        self.push(json!({"type": "user", "message": {"role": "user", "content": prompt}}));
        let steps = self.rng.range(1, 4);
        for _ in 0..steps {
            if self.full() {
                return;
            }
            self.responses += 1;
            let id = format!("msg_01{:022}", self.responses);
            if self.rng.chance(35) {
                let len = self.rng.range(60, 350);
                let thinking = prose(&mut self.rng, len);
                let sig_len = self.rng.range(100, 300);
                let sig = signature(&mut self.rng, sig_len);
                self.assistant(
                    &id,
                    json!({"type": "thinking", "thinking": thinking, "signature": sig}),
                    None,
                );
            }
            if self.rng.chance(50) {
                let len = self.rng.range(20, 250);
                let text = prose(&mut self.rng, len);
                self.assistant(&id, json!({"type": "text", "text": text}), None);
            }
            let calls = if self.rng.chance(25) { 2 } else { 1 };
            let mut ids = Vec::new();
            for call in 0..calls {
                self.tools += 1;
                let tool_id = format!("toolu_01{:022}", self.tools);
                let rng = &mut self.rng;
                let (name, input) = match rng.range(0, 3) {
                    0 => (
                        "Read",
                        json!({"file_path": format!("/work/loupe/{}", rng.pick(FILES))}),
                    ),
                    1 => ("Grep", json!({"pattern": rng.pick(WORDS), "path": "src"})),
                    2 => (
                        "Bash",
                        json!({"command": format!("cargo test {} -- --nocapture", rng.pick(WORDS)), "timeout": 120000}),
                    ),
                    _ => {
                        let old = prose(rng, 60);
                        let new = prose(rng, 80);
                        (
                            "Edit",
                            json!({"file_path": format!("/work/loupe/{}", rng.pick(FILES)),
                                        "old_string": old, "new_string": new}),
                        )
                    }
                };
                self.assistant(
                    &id,
                    json!({"type": "tool_use", "id": tool_id, "name": name, "input": input}),
                    (call + 1 == calls).then_some("tool_use"),
                );
                ids.push(tool_id);
            }
            if self.rng.chance(30) {
                self.push(json!({"type": "progress", "data": {"type": "bash_progress",
                    "output": "   Compiling loupe v0.1.0\n", "elapsed_ms": 1200}}));
            }
            for tool_id in ids {
                let rng = &mut self.rng;
                // Mostly short outputs, a fat tail of multi-KB listings and logs.
                let len = match rng.range(0, 9) {
                    0..=5 => rng.range(30, 150),
                    6..=8 => rng.range(300, 900),
                    _ => rng.range(1200, 3000),
                };
                let is_error = rng.chance(5);
                let output = tool_output(rng, len);
                self.push(
                    json!({"type": "user", "message": {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": tool_id, "content": output,
                     "is_error": is_error}]},
                    "tool_use_result": {"stdout_lines": len / 60, "interrupted": false}}),
                );
            }
        }
        if self.full() {
            return;
        }
        self.responses += 1;
        let id = format!("msg_01{:022}", self.responses);
        let len = self.rng.range(40, 350);
        let text = prose(&mut self.rng, len);
        self.assistant(&id, json!({"type": "text", "text": text}), Some("end_turn"));
        if self.rng.chance(5) {
            self.push(json!({"type": "system", "subtype": "informational",
                "content": "Auto-update available", "level": "info"}));
        }
    }
}

/// `n` entries of a history, as JSON values (deterministic for a given `seed`).
pub fn history_values(n: usize, seed: u64) -> Vec<Value> {
    let mut g = Gen {
        rng: Lcg::new(seed),
        out: Vec::with_capacity(n),
        n,
        responses: 0,
        tools: 0,
    };
    while !g.full() {
        g.turn();
    }
    g.out.truncate(n);
    g.out
}

/// The history as one JSON array, the way a stored thread is read back.
pub fn history_json(n: usize, seed: u64) -> Vec<u8> {
    serde_json::to_vec(&history_values(n, seed)).unwrap()
}
