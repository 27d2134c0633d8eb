//! Loupe: tool ids and names the provider accepts, rewritten consistently on both sides.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::blocks::{
    caller_of, fnv1a, is_server_result, is_type, is_valid_server_tool_id, is_valid_tool_id,
    str_field,
};
use super::{Ctx, Msg, Provider, RepairKind};

/// Tool names as every provider accepts them, for error messages (`docs/PROVIDER-RULES.md` A4.10).
pub const TOOL_NAME_RULE: &str = "1–64 characters of [a-zA-Z0-9_-]";

/// Whether `name` is a tool name every provider accepts.
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Max length of an OpenAI tool call id.
pub const OPENAI_MAX_ID: usize = 40;

/// Whether a client tool id is acceptable as is for `provider`.
pub fn valid_id(id: &str, provider: Provider) -> bool {
    is_valid_tool_id(id) && (provider == Provider::Anthropic || id.len() <= OPENAI_MAX_ID)
}

/// A deterministic id for `original`: `prefix` + 16 hex digits of FNV-1a over the original (with
/// a counter on collision), never one in `taken`.
pub fn mint(original: &str, prefix: &str, taken: &HashSet<String>) -> String {
    let mut salt = 0u32;
    loop {
        let mut data = original.as_bytes().to_vec();
        if salt > 0 {
            data.extend_from_slice(format!("#{salt}").as_bytes());
        }
        let id = format!("{prefix}{:016x}", fnv1a(&data));
        if !taken.contains(&id) {
            return id;
        }
        salt += 1;
    }
}

/// `^[a-zA-Z0-9_-]{1,64}$` for OpenAI function names: other characters become `_`.
pub fn sanitize_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() {
        s = "unknown_tool".into();
    }
    s
}

/// Rewrites invalid ids. Runs after pairing, so `tool_use` ids are unique and every `tool_result`
/// answers a `tool_use` of the previous turn: a request-wide map original → new id is consistent.
/// Valid ids are kept (they are reserved first, so a minted id never collides with one); invalid
/// ones become `toolu_<hex16>` (Anthropic) / `call_<hex16>` (OpenAI, Gemini: ≤ 40 chars). Server
/// tool ids that do not match `^srvtoolu_[a-zA-Z0-9_]+$` become `srvtoolu_<hex16>` together with
/// their result blocks in the same turn. For the other providers, function names are sanitized.
/// Reports `tool_id_rewritten` / `tool_name_rewritten`.
pub fn sanitize_ids(msgs: &mut [Msg], provider: Provider, ctx: &mut Ctx) {
    let rewrites = rewrite_ids(msgs, provider, ctx);
    report_rewrites(rewrites, ctx);
}

/// The client tool ids [`rewrite_ids`] rewrote, in order, with the new id and the blocks involved.
pub struct Rewrites {
    order: Vec<String>,
    map: HashMap<String, (String, Vec<u32>)>,
}

/// The rewriting part of [`sanitize_ids`]: server ids and names are reported as they are
/// rewritten, client ids only by [`report_rewrites`], once both sides of each pair are known.
pub fn rewrite_ids(msgs: &mut [Msg], provider: Provider, ctx: &mut Ctx) -> Rewrites {
    let mut taken: HashSet<String> = HashSet::new();
    let mut any_invalid = false;
    for m in msgs.iter().filter(|m| m.is_assistant()) {
        for b in m.blocks.iter().filter(|b| is_type(&b.v, "tool_use")) {
            let id = str_field(&b.v, "id").unwrap_or("");
            if valid_id(id, provider) {
                taken.insert(id.to_string());
            } else {
                any_invalid = true;
            }
        }
    }
    let prefix = if provider != Provider::Anthropic {
        "call_"
    } else {
        "toolu_"
    };
    // original id → (new id, srcs)
    let mut map: HashMap<String, (String, Vec<u32>)> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut server = ServerIds::of(msgs, provider);
    for m in msgs.iter_mut() {
        if m.is_assistant() {
            if any_invalid {
                for b in m.blocks.iter_mut().filter(|b| is_type(&b.v, "tool_use")) {
                    let id = str_field(&b.v, "id").unwrap_or("").to_string();
                    if valid_id(&id, provider) {
                        continue;
                    }
                    let new = mint(&id, prefix, &taken);
                    taken.insert(new.clone());
                    b.v["id"] = Value::String(new.clone());
                    order.push(id.clone());
                    map.insert(id, (new, vec![b.src]));
                }
            }
            if provider == Provider::Anthropic {
                fix_server_ids(m, &mut server, ctx);
            } else {
                fix_names(m, ctx);
            }
        } else if !map.is_empty() {
            for b in m.blocks.iter_mut().filter(|b| is_type(&b.v, "tool_result")) {
                let id = str_field(&b.v, "tool_use_id").unwrap_or("");
                if let Some((new, srcs)) = map.get_mut(id) {
                    b.v["tool_use_id"] = Value::String(new.clone());
                    srcs.push(b.src);
                }
            }
        }
    }
    Rewrites { order, map }
}

/// Reports the client tool ids [`rewrite_ids`] rewrote (`tool_id_rewritten`), in order.
pub fn report_rewrites(rewrites: Rewrites, ctx: &mut Ctx) {
    let Rewrites { order, map } = rewrites;
    for orig in order {
        let (new, srcs) = &map[&orig];
        ctx.report(
            RepairKind::ToolIdRewritten,
            srcs.iter().copied(),
            format!("tool_use id {orig:?} rewritten to {new} (and its tool_result)"),
        );
    }
}

/// Server ids rewritten so far in the request, original → new: a deferred call's result and the
/// client calls it made (`caller.tool_id`) can sit in later turns (programmatic tool calling).
struct ServerIds {
    map: HashMap<String, String>,
    /// Every id in the request, when one needs rewriting (a minted id must be new); `None` in
    /// nearly every request, which has none to rewrite.
    taken: Option<HashSet<String>>,
}

impl ServerIds {
    fn of(msgs: &[Msg], provider: Provider) -> ServerIds {
        let blocks = || msgs.iter().flat_map(|m| &m.blocks);
        let needed = provider == Provider::Anthropic
            && blocks().any(|b| {
                is_type(&b.v, "server_tool_use")
                    && !is_valid_server_tool_id(str_field(&b.v, "id").unwrap_or(""))
            });
        let taken = needed.then(|| {
            blocks()
                .filter_map(|b| str_field(&b.v, "id"))
                .map(String::from)
                .collect()
        });
        ServerIds {
            map: HashMap::new(),
            taken,
        }
    }
}

fn fix_server_ids(m: &mut Msg, server: &mut ServerIds, ctx: &mut Ctx) {
    let Some(taken) = server.taken.as_mut() else {
        return;
    };
    for b in m.blocks.iter_mut() {
        if is_type(&b.v, "server_tool_use") {
            let id = str_field(&b.v, "id").unwrap_or("").to_string();
            if is_valid_server_tool_id(&id) {
                continue;
            }
            let new = match server.map.get(&id) {
                Some(new) => new.clone(),
                None => {
                    let new = mint(&id, "srvtoolu_", taken);
                    taken.insert(new.clone());
                    server.map.insert(id.clone(), new.clone());
                    new
                }
            };
            b.v["id"] = Value::String(new.clone());
            ctx.report(
                RepairKind::ToolIdRewritten,
                [b.src],
                format!("server_tool_use id {id:?} rewritten to {new} (and its result)"),
            );
        } else if is_server_result(&b.v) {
            if let Some(new) = str_field(&b.v, "tool_use_id").and_then(|id| server.map.get(id)) {
                b.v["tool_use_id"] = Value::String(new.clone());
            }
        } else if is_type(&b.v, "tool_use") {
            let caller = caller_of(&b.v).and_then(|id| server.map.get(id));
            if let Some(new) = caller.cloned() {
                b.v["caller"]["tool_id"] = Value::String(new);
            }
        }
    }
}

fn fix_names(m: &mut Msg, ctx: &mut Ctx) {
    for b in m.blocks.iter_mut().filter(|b| is_type(&b.v, "tool_use")) {
        let name = str_field(&b.v, "name").unwrap_or("");
        let clean = sanitize_name(name);
        if clean != name {
            let detail = format!("tool name {name:?} rewritten to {clean}");
            b.v["name"] = Value::String(clean);
            ctx.report(RepairKind::ToolNameRewritten, [b.src], detail);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": name, "input": {}})
    }

    #[test]
    fn invalid_ids_rewritten_on_both_sides() {
        let e = vec![
            asst(
                0,
                "X",
                json!([call("functions.Bash:0", "Bash"), call("ok_1", "Bash")]),
            ),
            user(1, json!([tr("functions.Bash:0"), tr("ok_1")])),
        ];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        sanitize_ids(&mut m, Provider::Anthropic, &mut ctx);
        let new = m[0].blocks[0].v["id"].as_str().unwrap().to_string();
        assert!(new.starts_with("toolu_") && is_valid_tool_id(&new));
        assert_eq!(m[1].blocks[0].v["tool_use_id"], json!(new));
        assert_eq!(m[0].blocks[1].v["id"], json!("ok_1"));
        assert_eq!(kinds(&ctx), vec![RepairKind::ToolIdRewritten]);
        assert_eq!(ctx.repairs[0].seqs, vec![0, 1]);
    }

    #[test]
    fn openai_ids_at_most_40_and_unique_names_sanitized() {
        let long = "toolu_".to_string() + &"a".repeat(60);
        let e = vec![
            asst(
                0,
                "X",
                json!([call(&long, "mcp__srv.tool"), call("", "Bash")]),
            ),
            user(1, json!([tr(&long), tr("")])),
        ];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        sanitize_ids(&mut m, Provider::Openai, &mut ctx);
        let a = m[0].blocks[0].v["id"].as_str().unwrap();
        let b = m[0].blocks[1].v["id"].as_str().unwrap();
        assert!(a.len() <= 40 && b.len() <= 40 && a != b);
        assert!(valid_id(a, Provider::Openai) && valid_id(b, Provider::Openai));
        assert_eq!(m[1].blocks[0].v["tool_use_id"], json!(a));
        assert_eq!(m[1].blocks[1].v["tool_use_id"], json!(b));
        assert_eq!(m[0].blocks[0].v["name"], json!("mcp__srv_tool"));
    }

    #[test]
    fn mint_avoids_collisions() {
        let first = mint("x", "call_", &HashSet::new());
        let taken: HashSet<String> = [first.clone()].into();
        let second = mint("x", "call_", &taken);
        assert_ne!(first, second);
        assert_eq!(mint("x", "call_", &HashSet::new()), first);
    }

    #[test]
    fn server_ids_rewritten_with_their_results() {
        let e = vec![asst(
            0,
            "X",
            json!([
                {"type": "server_tool_use", "id": "srv-1", "name": "web_search", "input": {}},
                {"type": "web_search_tool_result", "tool_use_id": "srv-1", "content": []},
            ]),
        )];
        let mut m = msgs(&e);
        let mut ctx = Ctx::new(&e);
        sanitize_ids(&mut m, Provider::Anthropic, &mut ctx);
        let id = m[0].blocks[0].v["id"].as_str().unwrap();
        assert!(is_valid_server_tool_id(id));
        assert_eq!(m[0].blocks[1].v["tool_use_id"], json!(id));
    }
}
