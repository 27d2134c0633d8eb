//! Ready to shard (issue 37): the schema and the store's SQL keep the rules Citus sets, so the
//! tables can be distributed without a change of schema or query. Citus is not installed here:
//! the rules are read from the catalog of a freshly migrated PostgreSQL database and from the
//! SQL text of `src/store`.
//!
//! Every table has a declared role ([`ROLES`]):
//! - distributed by a column, with the other tables of its co-location group: the per-thread
//!   tables by `thread_key` (co-located with `messages`), thread names by `tenant_id`;
//! - a reference table, copied whole to every node: small, tenant-level tables;
//! - local to the coordinator: the job queue and sqlx's migration record.
//!
//! The catalog must keep to the roles: every primary key and unique index of a distributed
//! table holds its distribution column (which is NOT NULL, of one type across its group); a
//! foreign key points at a reference table, or joins co-located tables on their distribution
//! columns; a reference table holds nothing per thread. And no query of the store joins two
//! threads' rows: a join (or a correlated subquery) between distributed tables equates their
//! distribution columns, and one between a distributed table and a local table, a subquery or a
//! CTE reaches the distributed table by its distribution column (reference tables and rows of
//! values join on any column).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, TokenStream, TokenTree};

use crate::common::{postgres_admin_url, Backend, TestApp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Sharded by `column`; the tables of one `group` are co-located (the shards of one value
    /// of their columns live on one node).
    Distributed {
        column: &'static str,
        group: &'static str,
    },
    /// Copied whole to every node, so it joins any shard where it is.
    Reference,
    /// Kept on the coordinator only.
    Local,
}

use Role::{Local, Reference};

/// The per-thread tables: a thread's rows live on one node.
const THREAD: Role = Role::Distributed {
    column: "thread_key",
    group: "thread",
};

/// Tables keyed by tenant with a row per thread (too large to copy to every node).
const TENANT: Role = Role::Distributed {
    column: "tenant_id",
    group: "tenant",
};

/// Every table of the schema, its role and why. A table missing here fails the test.
const ROLES: &[(&str, Role, &str)] = &[
    (
        "threads",
        THREAD,
        "a row per thread, moved with its messages by every append",
    ),
    ("messages", THREAD, "the thread's entries"),
    (
        "thread_metadata",
        THREAD,
        "the thread's metadata as jsonb, indexed (PostgreSQL only)",
    ),
    ("search_rows", THREAD, "the thread's searchable text"),
    ("tree_nodes", THREAD, "the thread's summary tree"),
    ("outlines", THREAD, "the thread's outline"),
    ("outline_merges", THREAD, "the thread's outline moves"),
    ("cursors", THREAD, "the thread's consumers' bookmarks"),
    ("thread_settings", THREAD, "the thread's settings"),
    ("erasures", THREAD, "the thread's erasure receipts"),
    (
        "thread_events",
        THREAD,
        "the thread's events other than its entries",
    ),
    (
        "overhead_sources",
        THREAD,
        "which overheads the thread taught",
    ),
    (
        "thread_names",
        TENANT,
        "a row per thread: its (tenant, id) name, which requests name it by, unique here \
         since a unique index of `threads` must hold `thread_key`",
    ),
    ("tenants", Reference, "a row per tenant"),
    (
        "api_keys",
        Reference,
        "a few rows per tenant, read by every authenticated request",
    ),
    (
        "model_overheads",
        Reference,
        "a row per tenant and model (at most 16 models learned in 30 days), read beside any \
         thread's estimate and forgotten beside the thread's `overhead_sources`",
    ),
    (
        "jobs",
        Local,
        "the work queue, not thread data: claimed oldest first across every thread with \
         FOR UPDATE SKIP LOCKED, its active `dedup_key` unique across the cluster, and a job \
         may name no thread (`thread_key` NULL); it reaches threads by `thread_key` only",
    ),
    (
        "tenant_retention",
        Reference,
        "a row per tenant: its retention policy, read by lists and the retention sweep",
    ),
    (
        "webhook_endpoints",
        Reference,
        "a few rows per tenant (16 at most), read by the outbox's triggers beside any thread",
    ),
    (
        "webhook_deliveries",
        Local,
        "the webhook outbox, a work queue like `jobs`: claimed oldest first per endpoint; it \
         names threads by id and reaches no thread's rows",
    ),
    (
        "_sqlx_migrations",
        Local,
        "sqlx's record of applied migrations",
    ),
];

fn roles() -> BTreeMap<&'static str, Role> {
    ROLES
        .iter()
        .map(|(table, role, _)| (*table, *role))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The catalog.

#[derive(Debug, Clone, Default)]
struct Catalog {
    /// Table → its columns.
    tables: BTreeMap<String, Vec<Column>>,
    uniques: Vec<UniqueIndex>,
    foreign_keys: Vec<ForeignKey>,
}

#[derive(Debug, Clone)]
struct Column {
    name: String,
    not_null: bool,
    data_type: String,
}

/// A primary key, unique constraint or unique index.
#[derive(Debug, Clone)]
struct UniqueIndex {
    table: String,
    name: String,
    /// Its key columns that are plain columns (not expressions, not `INCLUDE`d).
    columns: Vec<String>,
}

#[derive(Debug, Clone)]
struct ForeignKey {
    name: String,
    table: String,
    columns: Vec<String>,
    target: String,
    target_columns: Vec<String>,
}

async fn read_catalog(url: &str) -> Catalog {
    let pool = sqlx::PgPool::connect(url)
        .await
        .expect("connect to read the catalog");
    let mut catalog = Catalog::default();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_class \
         WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for table in tables {
        catalog.tables.insert(table, Vec::new());
    }
    let columns: Vec<(String, String, bool, String)> = sqlx::query_as(
        "SELECT c.relname::text, a.attname::text, a.attnotnull, \
         format_type(a.atttypid, a.atttypmod) \
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
         WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') \
         AND a.attnum > 0 AND NOT a.attisdropped ORDER BY c.relname, a.attnum",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for (table, name, not_null, data_type) in columns {
        catalog.tables.entry(table).or_default().push(Column {
            name,
            not_null,
            data_type,
        });
    }
    let uniques: Vec<(String, String, Vec<String>)> = sqlx::query_as(
        "SELECT t.relname::text, i.relname::text, \
         ARRAY(SELECT a.attname::text FROM unnest(x.indkey) WITH ORDINALITY AS k(attnum, n) \
               JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum \
               WHERE k.n <= x.indnkeyatts ORDER BY k.n) \
         FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
         JOIN pg_class t ON t.oid = x.indrelid \
         WHERE t.relnamespace = current_schema()::regnamespace AND x.indisunique",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    catalog.uniques = uniques
        .into_iter()
        .map(|(table, name, columns)| UniqueIndex {
            table,
            name,
            columns,
        })
        .collect();
    // Name, table, columns, target, target columns.
    type ForeignKeyRow = (String, String, String, Vec<String>, Vec<String>);
    let foreign_keys: Vec<ForeignKeyRow> = sqlx::query_as(
        "SELECT c.conname::text, s.relname::text, d.relname::text, \
         ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY AS k(attnum, n) \
               JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum \
               ORDER BY k.n), \
         ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY AS k(attnum, n) \
               JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum \
               ORDER BY k.n) \
         FROM pg_constraint c JOIN pg_class s ON s.oid = c.conrelid \
         JOIN pg_class d ON d.oid = c.confrelid \
         WHERE c.contype = 'f' AND c.connamespace = current_schema()::regnamespace",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    catalog.foreign_keys = foreign_keys
        .into_iter()
        .map(
            |(name, table, target, columns, target_columns)| ForeignKey {
                name,
                table,
                columns,
                target,
                target_columns,
            },
        )
        .collect();
    pool.close().await;
    catalog
}

/// Every way the catalog breaks the roles, one line each (empty when it keeps them).
fn catalog_violations(catalog: &Catalog, roles: &BTreeMap<&str, Role>) -> Vec<String> {
    let mut found = Vec::new();
    for table in catalog.tables.keys() {
        if !roles.contains_key(table.as_str()) {
            found.push(format!("table {table} has no role in ROLES"));
        }
    }
    for table in roles.keys() {
        if !catalog.tables.contains_key(*table) {
            found.push(format!(
                "ROLES names {table}, which the schema does not have"
            ));
        }
    }
    let column = |table: &str, name: &str| -> Option<&Column> {
        catalog.tables.get(table)?.iter().find(|c| c.name == name)
    };
    // Distributed tables: the column, its type per group, and every unique index.
    let mut group_types: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (table, role) in roles {
        let Role::Distributed { column: by, group } = *role else {
            continue;
        };
        if !catalog.tables.contains_key(*table) {
            continue;
        }
        match column(table, by) {
            None => found.push(format!(
                "{table} is distributed by {by}, which it does not have"
            )),
            Some(c) => {
                if !c.not_null {
                    found.push(format!(
                        "{table}.{by} is its distribution column but may be NULL"
                    ));
                }
                group_types
                    .entry(group)
                    .or_default()
                    .insert(c.data_type.clone());
            }
        }
        for index in catalog.uniques.iter().filter(|u| u.table == *table) {
            if !index.columns.iter().any(|c| c == by) {
                found.push(format!(
                    "{table} is distributed by {by}, but its unique index {} is on ({}) only",
                    index.name,
                    index.columns.join(", ")
                ));
            }
        }
    }
    for (group, types) in group_types {
        if types.len() > 1 {
            found.push(format!(
                "the {group} group's distribution columns differ in type: {types:?}"
            ));
        }
    }
    // Foreign keys.
    for fk in &catalog.foreign_keys {
        let from = roles.get(fk.table.as_str()).copied();
        let to = roles.get(fk.target.as_str()).copied();
        let fine = match (from, to) {
            (Some(Reference), Some(Reference)) => true,
            (Some(_), Some(Reference)) => true,
            (Some(Local), Some(Local)) => true,
            (
                Some(Role::Distributed { column: by, group }),
                Some(Role::Distributed {
                    column: target_by,
                    group: target_group,
                }),
            ) => {
                group == target_group
                    && fk
                        .columns
                        .iter()
                        .zip(&fk.target_columns)
                        .any(|(c, t)| c == by && t == target_by)
            }
            _ => false,
        };
        if !fine {
            found.push(format!(
                "foreign key {} from {} ({}) to {} ({}) neither points at a reference table nor \
                 joins co-located tables on their distribution columns",
                fk.name,
                fk.table,
                fk.columns.join(", "),
                fk.target,
                fk.target_columns.join(", ")
            ));
        }
    }
    // Reference tables hold tenant-level rows, nothing per thread.
    for (table, role) in roles {
        if *role != Reference || !catalog.tables.contains_key(*table) {
            continue;
        }
        if column(table, "thread_key").is_some() {
            found.push(format!(
                "reference table {table} holds rows per thread (thread_key)"
            ));
        }
        let tenant_level =
            *table == "tenants" || column(table, "tenant_id").is_some_and(|c| c.not_null);
        if !tenant_level {
            found.push(format!(
                "reference table {table} is not a tenant-level table"
            ));
        }
    }
    found.sort();
    found
}

/// The rules hold for the schema as migrated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migrated_schema_keeps_every_tables_role() {
    let app = TestApp::new(Backend::Postgres).await;
    let catalog = read_catalog(&app.url).await;
    // The catalog was read at all: the shape the checks below rely on.
    assert!(catalog.tables.contains_key("messages"), "{catalog:?}");
    assert!(
        catalog
            .uniques
            .iter()
            .any(|u| u.table == "messages" && u.columns == ["thread_key", "seq"]),
        "{catalog:?}"
    );
    assert!(
        catalog
            .foreign_keys
            .iter()
            .any(|fk| fk.table == "api_keys" && fk.target == "tenants"),
        "{catalog:?}"
    );
    let found = catalog_violations(&catalog, &roles());
    assert!(
        found.is_empty(),
        "the schema breaks its roles:\n{}",
        found.join("\n")
    );
    app.finish().await;
}

/// The schema as it stood before migration 0018 breaks the rules where it did: the checks see
/// what they are for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_before_0018_breaks_the_rules_it_broke() {
    let admin_url = postgres_admin_url();
    let (name, url) = crate::common::create_test_database(&admin_url).await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name().unwrap().to_str().unwrap() < "0018")
        .collect();
    files.sort();
    assert_eq!(files.len(), 17, "{files:?}");
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    for file in &files {
        let sql = std::fs::read_to_string(file).unwrap();
        sqlx::raw_sql(&sql).execute(&pool).await.unwrap();
    }
    pool.close().await;
    let mut roles = roles();
    roles.remove("_sqlx_migrations");
    let found = catalog_violations(&read_catalog(&url).await, &roles);
    assert_eq!(
        found,
        [
            "ROLES names tenant_retention, which the schema does not have",
            "ROLES names thread_events, which the schema does not have",
            "ROLES names thread_metadata, which the schema does not have",
            "ROLES names thread_names, which the schema does not have",
            "ROLES names webhook_deliveries, which the schema does not have",
            "ROLES names webhook_endpoints, which the schema does not have",
            "erasures is distributed by thread_key, but its unique index erasures_pkey is on \
             (erasure_id) only",
            "threads is distributed by thread_key, but its unique index \
             threads_tenant_id_thread_id_key is on (tenant_id, thread_id) only",
        ]
    );
    crate::common::drop_test_database(&admin_url, &name).await;
}

/// The checks of foreign keys and reference tables, on planted catalogs (the schema has one
/// foreign key, which keeps the rules).
#[test]
fn the_catalog_check_finds_planted_violations() {
    let text = |name: &str| Column {
        name: name.to_owned(),
        not_null: true,
        data_type: "text".to_owned(),
    };
    let mut catalog = Catalog::default();
    catalog.tables.insert(
        "messages".into(),
        vec![text("thread_key"), text("seq"), text("tenant_id")],
    );
    catalog.tables.insert(
        "threads".into(),
        vec![text("thread_key"), text("tenant_id")],
    );
    catalog.tables.insert(
        "thread_names".into(),
        vec![text("tenant_id"), text("thread_key")],
    );
    catalog.tables.insert("jobs".into(), vec![text("job_id")]);
    catalog.tables.insert(
        "tenants".into(),
        vec![text("tenant_id"), text("thread_key")],
    );
    catalog.tables.insert("unroled".into(), vec![]);
    let fk = |name: &str, table: &str, columns: &[&str], target: &str, target_columns: &[&str]| {
        ForeignKey {
            name: name.into(),
            table: table.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            target: target.into(),
            target_columns: target_columns.iter().map(|c| c.to_string()).collect(),
        }
    };
    catalog.foreign_keys = vec![
        fk(
            "co_located",
            "messages",
            &["thread_key"],
            "threads",
            &["thread_key"],
        ),
        fk(
            "to_reference",
            "messages",
            &["tenant_id"],
            "tenants",
            &["tenant_id"],
        ),
        fk(
            "off_column",
            "messages",
            &["seq"],
            "threads",
            &["thread_key"],
        ),
        fk(
            "across_groups",
            "threads",
            &["tenant_id", "thread_key"],
            "thread_names",
            &["tenant_id", "thread_key"],
        ),
        fk("to_local", "messages", &["thread_key"], "jobs", &["job_id"]),
    ];
    let roles: BTreeMap<&str, Role> = [
        ("messages", THREAD),
        ("threads", THREAD),
        ("thread_names", TENANT),
        ("jobs", Local),
        ("tenants", Reference),
        ("api_keys", Reference),
    ]
    .into_iter()
    .collect();
    let found = catalog_violations(&catalog, &roles);
    let named = |what: &str| found.iter().filter(|v| v.contains(what)).count();
    assert_eq!(named("co_located"), 0, "{found:#?}");
    assert_eq!(named("to_reference"), 0, "{found:#?}");
    assert_eq!(named("off_column"), 1, "{found:#?}");
    assert_eq!(named("across_groups"), 1, "{found:#?}");
    assert_eq!(named("to_local"), 1, "{found:#?}");
    assert_eq!(named("table unroled has no role"), 1, "{found:#?}");
    assert_eq!(named("ROLES names api_keys"), 1, "{found:#?}");
    assert_eq!(
        named("reference table tenants holds rows per thread"),
        1,
        "{found:#?}"
    );
    assert_eq!(found.len(), 6, "{found:#?}");
}

/// Tables only PostgreSQL has: the index of what SQLite filters by scanning.
const POSTGRES_ONLY: &[&str] = &["thread_metadata"];

/// SQLite has the same tables (less its full-text indexes and [`POSTGRES_ONLY`]), so each has
/// its role there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_has_the_same_tables() {
    let app = TestApp::new(Backend::Sqlite).await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT name, COALESCE(sql, '') FROM sqlite_master WHERE type = 'table'")
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    let virtual_tables: Vec<&str> = rows
        .iter()
        .filter(|(_, sql)| sql.starts_with("CREATE VIRTUAL TABLE"))
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(virtual_tables.contains(&"search_index"), "{rows:?}");
    let tables: BTreeSet<&str> = rows
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| !name.starts_with("sqlite_"))
        .filter(|name| {
            !virtual_tables
                .iter()
                .any(|v| name == v || name.starts_with(&format!("{v}_")))
        })
        .collect();
    let declared: BTreeSet<&str> = ROLES
        .iter()
        .map(|(table, _, _)| *table)
        .filter(|table| !POSTGRES_ONLY.contains(table))
        .collect();
    assert_eq!(tables, declared);
    app.finish().await;
}

// ---------------------------------------------------------------------------------------------
// The store's SQL.

/// The string literals of a Rust file that read as SQL: every `"…"` or `r"…"` outside
/// attributes (doc comments among them), whole or a piece of a `format!`.
fn sql_literals(source: &str) -> Vec<String> {
    fn walk(stream: TokenStream, out: &mut Vec<String>) {
        let mut after_hash = false;
        for tree in stream {
            match tree {
                TokenTree::Group(group) => {
                    let attribute = after_hash && group.delimiter() == Delimiter::Bracket;
                    if !attribute {
                        walk(group.stream(), out);
                    }
                    after_hash = false;
                }
                // `#[…]` and `#![…]`.
                TokenTree::Punct(punct) => {
                    after_hash = punct.as_char() == '#' || (after_hash && punct.as_char() == '!');
                }
                TokenTree::Literal(literal) => {
                    if let Ok(text) = syn::parse_str::<syn::LitStr>(&literal.to_string()) {
                        out.push(text.value());
                    }
                    after_hash = false;
                }
                TokenTree::Ident(_) => after_hash = false,
            }
        }
    }
    let stream: TokenStream = source.parse().expect("the file is Rust");
    let mut literals = Vec::new();
    walk(stream, &mut literals);
    literals.retain(|text| {
        text.split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .any(|word| {
                matches!(
                    word,
                    "SELECT" | "INSERT" | "UPDATE" | "DELETE" | "FROM" | "JOIN" | "WHERE"
                )
            })
    });
    literals
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// An identifier or a keyword, lowercased.
    Word(String),
    /// `qualifier.column`, lowercased.
    Col(String, String),
    /// A bind parameter or a literal: one value wherever it is written (a `${}` of `format!`
    /// is a parameter of its own each time).
    Value(String),
    /// A `{…}` of `format!`: SQL spliced in at run time.
    Hole,
    Op(String),
    Comma,
    Semi,
}

#[derive(Clone, Debug)]
enum Node {
    Tok(Tok),
    Group(Vec<Node>),
}

fn parse_sql(sql: &str) -> Vec<Node> {
    let chars: Vec<char> = sql.chars().collect();
    let mut stack: Vec<Vec<Node>> = vec![Vec::new()];
    let mut holes = 0;
    let mut i = 0;
    let word_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let tok = if c.is_whitespace() {
            i += 1;
            continue;
        } else if c == '(' {
            stack.push(Vec::new());
            i += 1;
            continue;
        } else if c == ')' {
            if stack.len() > 1 {
                let group = stack.pop().unwrap();
                stack.last_mut().unwrap().push(Node::Group(group));
            }
            i += 1;
            continue;
        } else if c == '-' && chars.get(i + 1) == Some(&'-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        } else if c == '\'' {
            let start = i;
            i += 1;
            while i < chars.len() {
                if chars[i] == '\'' && chars.get(i + 1) == Some(&'\'') {
                    i += 2;
                } else if chars[i] == '\'' {
                    break;
                } else {
                    i += 1;
                }
            }
            i += 1;
            Tok::Value(chars[start..i.min(chars.len())].iter().collect())
        } else if c == '{' || (c == '$' && chars.get(i + 1) == Some(&'{')) {
            let dollar = c == '$';
            while i < chars.len() && chars[i] != '}' {
                i += 1;
            }
            i += 1;
            holes += 1;
            if dollar {
                Tok::Value(format!("${{}}#{holes}"))
            } else {
                Tok::Hole
            }
        } else if c == '$' || c == '?' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            Tok::Value(chars[start..i].iter().collect())
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            Tok::Value(chars[start..i].iter().collect())
        } else if word_char(c) || c == '"' {
            let read = |i: &mut usize| -> String {
                if chars[*i] == '"' {
                    let start = *i + 1;
                    *i = start;
                    while *i < chars.len() && chars[*i] != '"' {
                        *i += 1;
                    }
                    let word: String = chars[start..*i].iter().collect();
                    *i += 1;
                    word.to_lowercase()
                } else {
                    let start = *i;
                    while *i < chars.len() && word_char(chars[*i]) {
                        *i += 1;
                    }
                    chars[start..*i].iter().collect::<String>().to_lowercase()
                }
            };
            let word = read(&mut i);
            let qualified = chars.get(i) == Some(&'.')
                && chars
                    .get(i + 1)
                    .is_some_and(|&n| word_char(n) || n == '"' || n == '*');
            if qualified {
                i += 1;
                let column = if chars[i] == '*' {
                    i += 1;
                    "*".to_owned()
                } else {
                    read(&mut i)
                };
                Tok::Col(word, column)
            } else {
                Tok::Word(word)
            }
        } else if c == ',' {
            i += 1;
            Tok::Comma
        } else if c == ';' {
            i += 1;
            Tok::Semi
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let op = if matches!(two.as_str(), "<=" | ">=" | "<>" | "!=" | "::" | "||") {
                two
            } else {
                c.to_string()
            };
            i += op.chars().count();
            Tok::Op(op)
        };
        stack.last_mut().unwrap().push(Node::Tok(tok));
    }
    while stack.len() > 1 {
        let group = stack.pop().unwrap();
        stack.last_mut().unwrap().push(Node::Group(group));
    }
    stack.pop().unwrap()
}

/// What a name in a `FROM` or `JOIN` stands for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    Table(String),
    /// Rows of values, no table's: `VALUES`, or a function of parameters
    /// (`json_to_recordset($1)`). Like a reference table, it joins any shard on any column.
    Values,
    /// A subquery, a CTE, or SQL spliced in by `format!`: rows of tables it does not name here.
    Derived,
}

#[derive(Clone, Debug)]
struct Rel {
    source: Source,
    /// What its columns are qualified by.
    alias: String,
}

#[derive(PartialEq, Clone, Copy)]
enum Mode {
    Idle,
    /// In a `FROM` list and its joins.
    Chain,
    /// In an `ON` condition.
    On,
    /// In a `WHERE` condition.
    Where,
    /// In `UPDATE … SET`: a `FROM` after it extends the updated table's list.
    Set,
}

/// Words that end a relation (never an alias).
const KEYWORDS: &[&str] = &[
    "join",
    "left",
    "right",
    "inner",
    "outer",
    "full",
    "cross",
    "natural",
    "on",
    "using",
    "where",
    "group",
    "order",
    "limit",
    "offset",
    "returning",
    "set",
    "union",
    "intersect",
    "except",
    "for",
    "window",
    "having",
    "select",
    "from",
    "values",
    "as",
    "and",
    "or",
    "not",
    "lateral",
    "do",
    "into",
    "when",
    "then",
    "else",
    "end",
    "update",
    "delete",
    "insert",
    "with",
    "begin",
    "exists",
    "in",
    "is",
    "null",
    "case",
    "distinct",
];

fn is_subquery(nodes: &[Node]) -> bool {
    matches!(nodes.first(), Some(Node::Tok(Tok::Word(w))) if matches!(w.as_str(), "select" | "with" | "values"))
}

/// One SQL text read: its relations, which of them are joined, and which columns it equates.
#[derive(Default)]
struct Statement {
    bindings: BTreeMap<String, BTreeSet<Source>>,
    ctes: BTreeSet<String>,
    /// Union-find over `qualifier.column` and `=value` keys.
    parent: BTreeMap<String, String>,
    /// The relations of each `FROM` list with its joins: any two are joined.
    chains: Vec<Vec<Rel>>,
    /// The qualifiers one condition names: any two are joined (a correlated subquery's outer
    /// table among them).
    conditions: Vec<BTreeSet<String>>,
}

impl Statement {
    fn read(sql: &str) -> Statement {
        let mut statement = Statement::default();
        statement.scope(&parse_sql(sql));
        statement
    }

    fn find(&mut self, key: &str) -> String {
        let parent = self.parent.get(key).cloned();
        match parent {
            Some(parent) if parent != key => {
                let root = self.find(&parent);
                self.parent.insert(key.to_owned(), root.clone());
                root
            }
            _ => key.to_owned(),
        }
    }

    fn union(&mut self, a: &str, b: &str) {
        let (a, b) = (self.find(a), self.find(b));
        self.parent.entry(b.clone()).or_insert(b.clone());
        self.parent.insert(a, b);
    }

    /// Reads a relation at `nodes[i]`: returns it and the index after it (and its alias).
    fn relation(&mut self, nodes: &[Node], mut i: usize) -> Option<(Rel, usize)> {
        if matches!(nodes.get(i), Some(Node::Tok(Tok::Word(w))) if w == "lateral") {
            i += 1;
        }
        let (source, mut alias) = match nodes.get(i)? {
            Node::Tok(Tok::Word(name)) if !KEYWORDS.contains(&name.as_str()) => {
                if let Some(Node::Group(args)) = nodes.get(i + 1) {
                    // A function: `json_to_recordset($1) AS k(…)`.
                    self.scope(args);
                    i += 1;
                    let reads_tables = args
                        .iter()
                        .any(|n| matches!(n, Node::Group(inner) if is_subquery(inner)));
                    let source = if reads_tables {
                        Source::Derived
                    } else {
                        Source::Values
                    };
                    (source, String::new())
                } else if self.ctes.contains(name) {
                    (Source::Derived, name.clone())
                } else {
                    (Source::Table(name.clone()), name.clone())
                }
            }
            Node::Group(inner) => {
                self.scope(inner);
                let values =
                    matches!(inner.first(), Some(Node::Tok(Tok::Word(w))) if w == "values");
                let source = if values {
                    Source::Values
                } else {
                    Source::Derived
                };
                (source, String::new())
            }
            Node::Tok(Tok::Hole) => (Source::Derived, String::new()),
            _ => return None,
        };
        i += 1;
        if matches!(nodes.get(i), Some(Node::Tok(Tok::Word(w))) if w == "as") {
            i += 1;
        }
        if let Some(Node::Tok(Tok::Word(name))) = nodes.get(i) {
            if !KEYWORDS.contains(&name.as_str()) {
                alias = name.clone();
                i += 1;
                // Column names: `AS r(thread_key, …)`.
                if let Some(Node::Group(_)) = nodes.get(i) {
                    i += 1;
                }
            }
        }
        if !alias.is_empty() {
            self.bindings
                .entry(alias.clone())
                .or_default()
                .insert(source.clone());
        }
        Some((Rel { source, alias }, i))
    }

    /// Reads one level of parentheses (a whole text, a subquery, a CTE's body, a call's
    /// arguments); every group in it is a level of its own.
    fn scope(&mut self, nodes: &[Node]) {
        let mut chain: Vec<Rel> = Vec::new();
        let mut condition: Vec<Node> = Vec::new();
        let mut mode = Mode::Idle;
        let mut previous: Option<String> = None;
        let mut i = 0;
        // A piece of a `format!` that starts inside a FROM list: `x AS k JOIN threads ON …`.
        let joins = nodes
            .iter()
            .any(|n| matches!(n, Node::Tok(Tok::Word(w)) if w == "join"));
        let starts_with_name = match nodes.first() {
            Some(Node::Tok(Tok::Word(w))) => !KEYWORDS.contains(&w.as_str()),
            _ => false,
        };
        if joins && starts_with_name {
            if let Some((rel, after)) = self.relation(nodes, 0) {
                chain.push(rel);
                mode = Mode::Chain;
                i = after;
            }
        }
        while i < nodes.len() {
            let node = &nodes[i];
            let word = match node {
                Node::Tok(Tok::Word(w)) => Some(w.as_str()),
                _ => None,
            };
            let mut next = i + 1;
            match (node, word) {
                (Node::Group(inner), _) => {
                    self.scope(inner);
                    if matches!(mode, Mode::On | Mode::Where) {
                        condition.push(node.clone());
                    }
                }
                (_, Some("from")) if previous.as_deref() != Some("distinct") => {
                    self.end_condition(&mut condition);
                    if mode != Mode::Set {
                        self.end_chain(&mut chain);
                    }
                    mode = Mode::Chain;
                    if let Some((rel, after)) = self.relation(nodes, i + 1) {
                        chain.push(rel);
                        next = after;
                    }
                }
                (_, Some("left" | "right" | "inner" | "outer" | "full" | "cross" | "natural")) => {
                    self.end_condition(&mut condition);
                    mode = Mode::Chain;
                }
                (_, Some("join")) => {
                    self.end_condition(&mut condition);
                    mode = Mode::Chain;
                    if let Some((rel, after)) = self.relation(nodes, i + 1) {
                        chain.push(rel);
                        next = after;
                    }
                }
                (_, Some("on")) => {
                    self.end_condition(&mut condition);
                    if matches!(nodes.get(i + 1), Some(Node::Tok(Tok::Word(w))) if w == "conflict")
                    {
                        self.end_chain(&mut chain);
                        mode = Mode::Idle;
                        next = i + 2;
                    } else {
                        mode = Mode::On;
                    }
                }
                (_, Some("using")) => {
                    if let (Some(Node::Group(columns)), [.., left, right]) =
                        (nodes.get(i + 1), chain.as_slice())
                    {
                        let pairs: Vec<(String, String)> = columns
                            .iter()
                            .filter_map(|c| match c {
                                Node::Tok(Tok::Word(c)) => Some((
                                    format!("{}.{c}", left.alias),
                                    format!("{}.{c}", right.alias),
                                )),
                                _ => None,
                            })
                            .collect();
                        for (a, b) in pairs {
                            self.union(&a, &b);
                        }
                        next = i + 2;
                    }
                }
                (Node::Tok(Tok::Comma), _) if matches!(mode, Mode::Chain | Mode::On) => {
                    self.end_condition(&mut condition);
                    mode = Mode::Chain;
                    if let Some((rel, after)) = self.relation(nodes, i + 1) {
                        chain.push(rel);
                        next = after;
                    }
                }
                (_, Some("where")) => {
                    self.end_condition(&mut condition);
                    mode = Mode::Where;
                }
                (_, Some("set")) => {
                    self.end_condition(&mut condition);
                    mode = Mode::Set;
                }
                (_, Some("update"))
                    if !matches!(previous.as_deref(), Some("for" | "do" | "key")) =>
                {
                    self.end_condition(&mut condition);
                    self.end_chain(&mut chain);
                    mode = Mode::Chain;
                    if let Some((rel, after)) = self.relation(nodes, i + 1) {
                        chain.push(rel);
                        next = after;
                    }
                }
                (_, Some("into")) => {
                    self.end_condition(&mut condition);
                    self.end_chain(&mut chain);
                    mode = Mode::Idle;
                    next = i + 2;
                }
                (_, Some("with")) => {
                    self.end_condition(&mut condition);
                    self.end_chain(&mut chain);
                    mode = Mode::Idle;
                    next = self.ctes(nodes, i + 1);
                }
                (
                    _,
                    Some(
                        "select" | "insert" | "delete" | "values" | "union" | "intersect"
                        | "except" | "group" | "order" | "limit" | "offset" | "returning"
                        | "having" | "window" | "for" | "do" | "update",
                    ),
                )
                | (Node::Tok(Tok::Semi), _) => {
                    self.end_condition(&mut condition);
                    self.end_chain(&mut chain);
                    mode = Mode::Idle;
                }
                _ => {
                    if matches!(mode, Mode::On | Mode::Where) {
                        condition.push(node.clone());
                    }
                }
            }
            previous = word.map(str::to_owned);
            i = next;
        }
        self.end_condition(&mut condition);
        self.end_chain(&mut chain);
    }

    /// Reads `name AS [NOT] [MATERIALIZED] (…), …` after `WITH`; returns the index after it.
    fn ctes(&mut self, nodes: &[Node], mut i: usize) -> usize {
        if matches!(nodes.get(i), Some(Node::Tok(Tok::Word(w))) if w == "recursive") {
            i += 1;
        }
        loop {
            let Some(Node::Tok(Tok::Word(name))) = nodes.get(i) else {
                return i;
            };
            self.ctes.insert(name.clone());
            i += 1;
            // Its column names.
            if let (Some(Node::Group(_)), Some(Node::Tok(Tok::Word(w)))) =
                (nodes.get(i), nodes.get(i + 1))
            {
                if w == "as" {
                    i += 1;
                }
            }
            // `AS [NOT] MATERIALIZED`, or a `{…}` of `format!` that may say it.
            while let Some(Node::Tok(token)) = nodes.get(i) {
                let skipped = match token {
                    Tok::Word(w) => matches!(w.as_str(), "as" | "not" | "materialized"),
                    Tok::Hole => true,
                    _ => false,
                };
                if !skipped {
                    break;
                }
                i += 1;
            }
            if let Some(Node::Group(body)) = nodes.get(i) {
                self.scope(body);
                i += 1;
            }
            match nodes.get(i) {
                Some(Node::Tok(Tok::Comma)) => i += 1,
                _ => return i,
            }
        }
    }

    fn end_chain(&mut self, chain: &mut Vec<Rel>) {
        if chain.len() > 1 {
            self.chains.push(chain.clone());
        }
        chain.clear();
    }

    fn end_condition(&mut self, condition: &mut Vec<Node>) {
        if condition.is_empty() {
            return;
        }
        let mut named = BTreeSet::new();
        qualifiers(condition, &mut named);
        if named.len() > 1 {
            self.conditions.push(named);
        }
        let mut equal = Vec::new();
        equalities(condition, &mut equal);
        for (a, b) in equal {
            self.union(&a, &b);
        }
        condition.clear();
    }

    /// What a qualifier names in this text.
    fn resolve(&self, qualifier: &str, roles: &BTreeMap<&str, Role>) -> Source {
        match self.bindings.get(qualifier) {
            Some(sources) if sources.len() == 1 => sources.iter().next().unwrap().clone(),
            Some(_) => Source::Derived,
            None if roles.contains_key(qualifier) => Source::Table(qualifier.to_owned()),
            None => Source::Derived,
        }
    }

    /// Every pair of joined relations that breaks the rules, one line each; and how many
    /// pairs were checked.
    fn violations(&mut self, roles: &BTreeMap<&str, Role>) -> (Vec<String>, usize) {
        let mut pairs: Vec<(Rel, Rel)> = Vec::new();
        for chain in &self.chains {
            for (n, a) in chain.iter().enumerate() {
                for b in &chain[n + 1..] {
                    pairs.push((a.clone(), b.clone()));
                }
            }
        }
        for named in &self.conditions {
            let rels: Vec<Rel> = named
                .iter()
                .map(|q| Rel {
                    source: self.resolve(q, roles),
                    alias: q.clone(),
                })
                .collect();
            for (n, a) in rels.iter().enumerate() {
                for b in &rels[n + 1..] {
                    pairs.push((a.clone(), b.clone()));
                }
            }
        }
        let role = |rel: &Rel| match &rel.source {
            Source::Table(table) => roles.get(table.as_str()).copied(),
            Source::Values => Some(Reference),
            Source::Derived => None,
        };
        let name = |rel: &Rel| match &rel.source {
            Source::Table(table) if *table == rel.alias => table.clone(),
            Source::Table(table) => format!("{table} {}", rel.alias),
            Source::Values | Source::Derived if rel.alias.is_empty() => {
                "a derived table".to_owned()
            }
            Source::Values | Source::Derived => rel.alias.clone(),
        };
        let mut found = Vec::new();
        let mut checked = 0;
        let mut seen = BTreeSet::new();
        for (a, b) in pairs {
            if !a.alias.is_empty() && a.alias == b.alias {
                continue;
            }
            // A pair both in a join and in its condition is one pair.
            let pair = if a.alias <= b.alias {
                (a.alias.clone(), b.alias.clone())
            } else {
                (b.alias.clone(), a.alias.clone())
            };
            if !pair.0.is_empty() && !seen.insert(pair) {
                continue;
            }
            let (ra, rb) = (role(&a), role(&b));
            let distributed = |r: Option<Role>| matches!(r, Some(Role::Distributed { .. }));
            if distributed(ra) || distributed(rb) {
                checked += 1;
            }
            match (ra, rb) {
                (
                    Some(Role::Distributed {
                        column: ca,
                        group: ga,
                    }),
                    Some(Role::Distributed {
                        column: cb,
                        group: gb,
                    }),
                ) => {
                    if ga != gb {
                        found.push(format!(
                            "{} (by {ca}) is joined with {} (by {cb}), which is not co-located",
                            name(&a),
                            name(&b)
                        ));
                    } else if a.alias.is_empty()
                        || b.alias.is_empty()
                        || self.find(&format!("{}.{ca}", a.alias))
                            != self.find(&format!("{}.{cb}", b.alias))
                    {
                        found.push(format!(
                            "{} is joined with {} without {}.{ca} = {}.{cb}",
                            name(&a),
                            name(&b),
                            a.alias,
                            b.alias
                        ));
                    }
                }
                (Some(Role::Distributed { column, .. }), Some(Local) | None)
                | (Some(Local) | None, Some(Role::Distributed { column, .. })) => {
                    let (d, other) = if distributed(ra) { (&a, &b) } else { (&b, &a) };
                    let key = format!("{}.{column}", d.alias);
                    let root = self.find(&key);
                    let keys: Vec<String> = self.parent.keys().cloned().collect();
                    let reached = !d.alias.is_empty()
                        && keys.iter().any(|k| {
                            k != &key
                                && !k.starts_with(&format!("{}.", d.alias))
                                && self.find(k) == root
                        });
                    if !reached {
                        found.push(format!(
                            "{} is joined with {} but not by its distribution column {column}",
                            name(d),
                            name(other)
                        ));
                    }
                }
                _ => {}
            }
        }
        (found, checked)
    }
}

/// The qualifiers a condition names, outside its subqueries.
fn qualifiers(nodes: &[Node], out: &mut BTreeSet<String>) {
    for node in nodes {
        match node {
            Node::Tok(Tok::Col(q, _)) => {
                out.insert(q.clone());
            }
            Node::Group(inner) if !is_subquery(inner) => qualifiers(inner, out),
            _ => {}
        }
    }
}

/// The `a = b` of a condition that hold whatever else it says: its conjuncts at the top (and in
/// parentheses of conjuncts), none when an `OR` joins them.
fn equalities(nodes: &[Node], out: &mut Vec<(String, String)>) {
    let word = |n: &Node, w: &str| matches!(n, Node::Tok(Tok::Word(x)) if x == w);
    if nodes.iter().any(|n| word(n, "or")) {
        return;
    }
    let key = |n: &Node| match n {
        Node::Tok(Tok::Col(q, c)) => Some(format!("{q}.{c}")),
        Node::Tok(Tok::Value(v)) => Some(format!("={v}")),
        _ => None,
    };
    for conjunct in nodes.split(|n| word(n, "and")) {
        // Casts (`$1::json`) change no value's identity here.
        let mut plain: Vec<&Node> = Vec::new();
        let mut cast = false;
        for n in conjunct {
            if cast {
                cast = false;
            } else if matches!(n, Node::Tok(Tok::Op(op)) if op == "::") {
                cast = true;
            } else {
                plain.push(n);
            }
        }
        match plain.as_slice() {
            [a, Node::Tok(Tok::Op(op)), b] if op == "=" => {
                if let (Some(a), Some(b)) = (key(a), key(b)) {
                    out.push((a, b));
                }
            }
            [Node::Group(inner)] if !is_subquery(inner) => equalities(inner, out),
            _ => {}
        }
    }
}

/// The rule breaks of one SQL text, and how many joined pairs it checked.
fn join_violations(sql: &str, roles: &BTreeMap<&str, Role>) -> (Vec<String>, usize) {
    Statement::read(sql).violations(roles)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// No statement of the store joins two threads' rows (nor reaches a thread's table by another
/// column than its key, nor joins tables distributed apart).
#[test]
fn no_store_query_joins_two_threads_rows() {
    let roles = roles();
    let store = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
    let mut files = Vec::new();
    rust_files(&store, &mut files);
    files.sort();
    assert!(
        files.iter().any(|f| f.ends_with("append/sqlite_writer.rs")),
        "{files:?}"
    );
    let mut found = Vec::new();
    let (mut statements, mut checked) = (0, 0);
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        for sql in sql_literals(&source) {
            statements += 1;
            let (broken, pairs) = join_violations(&sql, &roles);
            checked += pairs;
            for violation in broken {
                let short: String = sql.chars().take(300).collect();
                found.push(format!(
                    "{}: {violation}\n    in: {short}",
                    file.strip_prefix(&store).unwrap().display()
                ));
            }
        }
    }
    // The reader found the store's SQL and its joins (search, the group reads, the jobs'
    // thread check, ...): a reader that finds nothing passes nothing.
    assert!(statements > 100, "{statements} statements read");
    assert!(checked > 20, "{checked} joined pairs checked");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check fails where it should: on planted joins across threads, apart from the
/// distribution column, or between tables distributed apart; and passes the store's shapes.
#[test]
fn the_join_check_finds_planted_cross_thread_joins() {
    let roles = roles();
    let bad = [
        // Two threads' rows: joined on another column than the thread's key.
        "SELECT m.body FROM messages m JOIN tree_nodes n ON n.seq = m.seq",
        // Every thread against one.
        "SELECT 1 FROM threads t JOIN messages m ON m.thread_key = $1",
        // A comma join of two threads by their tenant.
        "SELECT a.thread_key FROM threads a, threads b WHERE a.tenant_id = b.tenant_id",
        // The equality under an OR holds for no row in particular.
        "SELECT 1 FROM messages m JOIN threads t ON t.thread_key = m.thread_key OR t.tenant_id = $1",
        // The key is carried across one join but not the next.
        "SELECT 1 FROM search_rows r JOIN threads t ON t.thread_key = r.thread_key \
         JOIN messages m ON m.seq = r.seq",
        // A correlated subquery across threads.
        "DELETE FROM cursors c WHERE EXISTS \
         (SELECT 1 FROM messages m WHERE m.seq = c.bookmark_seq)",
        // Tables distributed by different columns.
        "SELECT t.metadata FROM thread_names n JOIN threads t ON t.thread_key = n.thread_key",
        // A local table reaching threads by tenant.
        "SELECT 1 FROM jobs j JOIN threads t ON t.tenant_id = j.tenant_id",
        // SQL spliced by `format!`, then joined off the key.
        "FROM {from} LEFT JOIN thread_settings s ON s.updated_at = threads.updated_at",
        // A derived table joined off the key.
        "SELECT 1 FROM (SELECT seq FROM messages WHERE thread_key = $1) p \
         JOIN messages m ON m.seq = p.seq",
        // A CTE likewise.
        "WITH p AS (SELECT seq FROM messages) SELECT 1 FROM p JOIN tree_nodes n ON n.idx = p.seq",
    ];
    for sql in bad {
        let (found, _) = join_violations(sql, &roles);
        assert!(!found.is_empty(), "passed: {sql}");
    }
    let good = [
        "SELECT t.thread_id FROM search_rows r JOIN threads t ON t.thread_key = r.thread_key \
         JOIN messages m ON m.thread_key = r.thread_key AND m.seq = r.seq WHERE t.tenant_id = $2",
        "SELECT 1 FROM threads t JOIN messages m ON m.thread_key = $1 WHERE t.thread_key = $1",
        "SELECT 1 FROM (SELECT seq FROM messages WHERE thread_key = $1) p \
         JOIN messages m ON m.thread_key = $1 AND m.seq = p.seq",
        "DELETE FROM model_overheads WHERE EXISTS (SELECT 1 FROM overhead_sources s \
         WHERE s.thread_key = $1 AND s.tenant_id = model_overheads.tenant_id)",
        "SELECT 1 FROM api_keys k JOIN threads t ON t.tenant_id = k.tenant_id",
        "UPDATE threads SET next_seq = v.column2 FROM (VALUES ($1, $2)) AS v \
         LEFT JOIN thread_settings s ON s.thread_key = v.column1 \
         WHERE threads.thread_key = v.column1 AND s.outline IS NOT DISTINCT FROM v.column3",
        "SELECT a.x FROM threads a JOIN threads b USING (thread_key)",
        // Rows of values join any column: each shard joins them with its own rows.
        "SELECT 1 FROM json_to_recordset($1::json) AS k(t text, i text) \
         JOIN threads ON threads.tenant_id = k.t AND threads.thread_id = k.i",
    ];
    for sql in good {
        let (found, checked) = join_violations(sql, &roles);
        assert!(found.is_empty(), "{sql}: {found:#?}");
        assert!(checked > 0, "nothing checked in {sql}");
    }
    // Through the reader of Rust files too: a `format!` piece, continued lines and all.
    let source = r#"
        /// Not SQL: `SELECT 1 FROM messages m JOIN threads t ON t.seq = m.seq`.
        fn planted(limit: i64) -> String {
            format!(
                "SELECT m.body FROM messages m \
                 JOIN tree_nodes n ON n.seq = m.seq LIMIT {limit}"
            )
        }
    "#;
    let literals = sql_literals(source);
    assert_eq!(literals.len(), 1, "{literals:?}");
    let (found, _) = join_violations(&literals[0], &roles);
    assert_eq!(
        found,
        ["messages m is joined with tree_nodes n without m.thread_key = n.thread_key"]
    );
}
