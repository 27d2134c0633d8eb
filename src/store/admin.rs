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
    fn only_plain_names_are_spliced() {
        assert!(checked_name("loupe_test_0a1b").is_ok());
        assert!(checked_name("x; DROP TABLE threads").is_err());
        assert!(checked_name("Upper").is_err());
        assert!(checked_name("").is_err());
    }
}
