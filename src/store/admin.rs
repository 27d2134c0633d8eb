//! Provisioning of whole PostgreSQL databases (per-test databases, operations scripts).

use super::{Backend, Store, StoreError};

/// A database name safe to splice into DDL: lowercase letters, digits and `_`, 1–63 bytes.
fn checked_name(name: &str) -> Result<&str, StoreError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(name)
    } else {
        Err(StoreError::Config(format!(
            "invalid database name {name:?}"
        )))
    }
}

/// A PostgreSQL URL naming another database on the same server: `postgres://u:p@h/a?x` with
/// `name` gives `postgres://u:p@h/name?x`.
pub fn database_url(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut database = format!("{}/{name}", &base[..path_start]);
    if let Some(query) = query {
        database.push('?');
        database.push_str(query);
    }
    database
}

impl Store {
    /// Creates an empty PostgreSQL database next to the one this store is connected to.
    pub async fn create_database(&self, name: &str) -> Result<(), StoreError> {
        self.require_postgres()?;
        sqlx::query(&format!("CREATE DATABASE {}", checked_name(name)?))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Drops a PostgreSQL database, closing its connections.
    pub async fn drop_database(&self, name: &str) -> Result<(), StoreError> {
        self.require_postgres()?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            checked_name(name)?
        ))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    fn require_postgres(&self) -> Result<(), StoreError> {
        match self.backend {
            Backend::Postgres => Ok(()),
            Backend::Sqlite => Err(StoreError::Config(
                "databases are created only on PostgreSQL".to_owned(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_swap_only_the_database_name() {
        assert_eq!(
            database_url("postgres://u:p@h:5432/postgres", "t1"),
            "postgres://u:p@h:5432/t1"
        );
        assert_eq!(
            database_url("postgres://u:p@h/postgres?sslmode=disable", "t1"),
            "postgres://u:p@h/t1?sslmode=disable"
        );
        assert_eq!(database_url("postgres://h", "t1"), "postgres://h/t1");
    }

    #[test]
    fn only_plain_names_are_spliced() {
        assert!(checked_name("loupe_test_0a1b").is_ok());
        assert!(checked_name("x; DROP TABLE threads").is_err());
        assert!(checked_name("Upper").is_err());
        assert!(checked_name("").is_err());
    }
}
