//! How a statement travels to the server: prepared (the extended protocol,
//! each statement parsed once per connection and kept under a name) or, for
//! a pooler in transaction mode, simple (one `Query` message holding the
//! statement with its values written in as literals).
//!
//! A pooler in transaction mode hands each transaction to whichever server
//! connection is free: a statement prepared under a name on one is missing
//! (26000) or another's (42P05) on the next, and sqlx's unnamed statements
//! are parsed and bound in two round trips, which the pooler may send to two
//! server connections. One simple `Query` message is one transaction on one
//! server connection, whatever the pooler: it is the only pooler-safe form,
//! and it costs the server a parse and plan per statement (measured in
//! docs/performance.md), so it is used only where it is needed.

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Executor, Postgres, SqlSafeStr, SqlStr};

/// How statements travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Named prepared statements, cached per connection.
    Prepared,
    /// One simple `Query` message per statement, values as literals, READ
    /// COMMITTED set for the statement's own (implicit) transaction.
    Simple,
}

/// A value bound to a statement's parameter, with the type sqlx declares
/// for it when prepared (and the simple form casts its literal to).
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Text(String),
    Int8(Option<i64>),
    Int4(Option<i32>),
    Bool(bool),
}

impl Value {
    /// The literal standing for the value in a simple statement: typed as
    /// the prepared statement's parameter would be. Text is an escape string
    /// (`E'…'`), read alike whatever `standard_conforming_strings` says;
    /// numbers are quoted and cast, so a negative one needs no parentheses.
    fn literal(&self) -> String {
        match self {
            Value::Text(text) => format!("{}::text", crate::sql::quote_literal(text)),
            Value::Int8(Some(n)) => format!("'{n}'::int8"),
            Value::Int4(Some(n)) => format!("'{n}'::int4"),
            Value::Int8(None) => "NULL::int8".into(),
            Value::Int4(None) => "NULL::int4".into(),
            Value::Bool(b) => format!("{b}"),
        }
    }
}

/// A statement and its values, `$1`, `$2`, … in order, ready to go by
/// either protocol.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    sql: SqlStr,
    values: Vec<Value>,
    /// The statement is its transaction's first (and only): the simple
    /// form sets READ COMMITTED for it.
    own_transaction: bool,
}

impl Call {
    pub(crate) fn new(sql: impl SqlSafeStr) -> Self {
        Call {
            sql: sql.into_sql_str(),
            values: Vec::new(),
            own_transaction: true,
        }
    }

    /// The statement runs inside a transaction the caller began (and set
    /// the isolation level of), or is a read that needs none.
    pub(crate) fn in_transaction(mut self) -> Self {
        self.own_transaction = false;
        self
    }

    pub(crate) fn text(mut self, value: &str) -> Self {
        self.values.push(Value::Text(value.to_owned()));
        self
    }

    pub(crate) fn int8(mut self, value: impl Into<Option<i64>>) -> Self {
        self.values.push(Value::Int8(value.into()));
        self
    }

    pub(crate) fn int4(mut self, value: impl Into<Option<i32>>) -> Self {
        self.values.push(Value::Int4(value.into()));
        self
    }

    pub(crate) fn boolean(mut self, value: bool) -> Self {
        self.values.push(Value::Bool(value));
        self
    }

    /// The prepared form: the statement with its values bound.
    fn prepared(self) -> Query<'static, Postgres, PgArguments> {
        self.values
            .into_iter()
            .fold(sqlx::query(self.sql), |query, value| match value {
                Value::Text(text) => query.bind(text),
                Value::Int8(n) => query.bind(n),
                Value::Int4(n) => query.bind(n),
                Value::Bool(b) => query.bind(b),
            })
    }

    /// The simple form: the statement with each `$n` replaced by its value's
    /// literal; first, for a statement in its own transaction, READ
    /// COMMITTED set for the implicit transaction a multi-statement `Query`
    /// message runs in (the session's default may be another level, and a
    /// pooler in transaction mode keeps no session setting of ours).
    fn simple(self) -> Result<sqlx::RawSql, sqlx::Error> {
        let body = inline(self.sql.as_str(), &self.values)?;
        let text = match self.own_transaction {
            true => format!("{}; {body}", crate::sql::READ_COMMITTED),
            false => body,
        };
        Ok(sqlx::raw_sql(sqlx::AssertSqlSafe(text)))
    }
}

/// Runs a [`Call`] by the method named, in the protocol's form.
macro_rules! run_as {
    ($protocol:expr, $call:expr, $method:ident($executor:expr)) => {
        match $protocol {
            Protocol::Prepared => $call.prepared().$method($executor).await,
            Protocol::Simple => $call.simple()?.$method($executor).await,
        }
    };
}

impl Protocol {
    /// Runs `call`; its first row.
    pub(crate) async fn fetch_optional<'e, E>(
        self,
        call: Call,
        executor: E,
    ) -> Result<Option<PgRow>, sqlx::Error>
    where
        E: Executor<'e, Database = Postgres>,
    {
        run_as!(self, call, fetch_optional(executor))
    }

    /// Runs `call`; every row.
    pub(crate) async fn fetch_all<'e, E>(
        self,
        call: Call,
        executor: E,
    ) -> Result<Vec<PgRow>, sqlx::Error>
    where
        E: Executor<'e, Database = Postgres>,
    {
        run_as!(self, call, fetch_all(executor))
    }

    /// Runs `call`; the rows it touched.
    pub(crate) async fn execute<'e, E>(self, call: Call, executor: E) -> Result<u64, sqlx::Error>
    where
        E: Executor<'e, Database = Postgres>,
    {
        Ok(run_as!(self, call, execute(executor))?.rows_affected())
    }
}

/// `sql` with every parameter `$n` outside quoted text replaced by the
/// literal of `values[n - 1]`. Single-quoted strings, quoted identifiers,
/// dollar-quoted bodies and comments are copied as they are. A parameter
/// with no value, or a value no parameter uses, is an error: the statement
/// and its binds disagree (a bug, caught by this crate's tests).
fn inline(sql: &str, values: &[Value]) -> Result<String, sqlx::Error> {
    let mismatch = |what: String| sqlx::Error::Protocol(format!("statement and values: {what}"));
    // A NUL would end the message's text early (validated before; checked
    // again, as the text goes to the server unbound).
    if values
        .iter()
        .any(|v| matches!(v, Value::Text(text) if text.contains('\0')))
    {
        return Err(mismatch("a text value holds NUL".into()));
    }
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 16 * values.len());
    let mut used = vec![false; values.len()];
    let mut i = 0;
    // Copies `sql[i..end]` and moves on.
    let copy_to = |out: &mut String, i: &mut usize, end: usize| {
        out.push_str(&sql[*i..end]);
        *i = end;
    };
    while i < bytes.len() {
        let rest = &sql[i..];
        match bytes[i] {
            quote @ (b'\'' | b'"') => {
                // To the closing quote; a doubled quote closes and reopens.
                let end = rest[1..]
                    .find(quote as char)
                    .map_or(bytes.len(), |at| i + at + 2);
                copy_to(&mut out, &mut i, end);
            }
            b'-' if rest.starts_with("--") => {
                let end = rest.find('\n').map_or(bytes.len(), |at| i + at);
                copy_to(&mut out, &mut i, end);
            }
            b'/' if rest.starts_with("/*") => {
                let end = rest.find("*/").map_or(bytes.len(), |at| i + at + 2);
                copy_to(&mut out, &mut i, end);
            }
            b'$' if rest[1..].starts_with(|c: char| c.is_ascii_digit()) => {
                let digits = rest[1..]
                    .find(|c: char| !c.is_ascii_digit())
                    .map_or(rest.len() - 1, |n| n);
                let n: usize = rest[1..=digits]
                    .parse()
                    .map_err(|_| mismatch(format!("parameter {}", &rest[..=digits])))?;
                let value = n
                    .checked_sub(1)
                    .and_then(|at| values.get(at))
                    .ok_or_else(|| mismatch(format!("${n} has no value")))?;
                used[n - 1] = true;
                out.push_str(&value.literal());
                i += 1 + digits;
            }
            b'$' => {
                // A dollar quote `$tag$…$tag$` (or a `$` inside a word).
                let tag_end = rest[1..]
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .map(|n| n + 1);
                match tag_end {
                    Some(t) if rest.as_bytes()[t] == b'$' => {
                        let tag = &rest[..=t];
                        let end = rest[t + 1..]
                            .find(tag)
                            .map_or(bytes.len(), |at| i + t + 1 + at + tag.len());
                        copy_to(&mut out, &mut i, end);
                    }
                    _ => {
                        let next = i + 1;
                        copy_to(&mut out, &mut i, next);
                    }
                }
            }
            _ => {
                let first = rest.chars().next().map_or(1, char::len_utf8);
                let next = rest[first..]
                    .find(['\'', '"', '-', '/', '$'])
                    .map_or(bytes.len(), |at| i + first + at);
                copy_to(&mut out, &mut i, next);
            }
        }
    }
    if let Some(unused) = used.iter().position(|u| !u) {
        return Err(mismatch(format!(
            "value {} is used by no parameter",
            unused + 1
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(sql: &str, values: &[Value]) -> String {
        inline(sql, values).unwrap()
    }

    #[test]
    fn parameters_become_typed_literals() {
        let values = [
            Value::Text("it's a \\ name".into()),
            Value::Int8(Some(-9_223_372_036_854_775_808)),
            Value::Int4(None),
            Value::Bool(true),
        ];
        assert_eq!(
            render("SELECT $1, $2 + $2, $3, $4", &values),
            "SELECT E'it''s a \\\\ name'::text, '-9223372036854775808'::int8 + \
             '-9223372036854775808'::int8, NULL::int4, true"
        );
    }

    #[test]
    fn quoted_text_comments_and_dollar_bodies_are_left_alone() {
        let values = [Value::Int8(Some(7))];
        assert_eq!(
            render(
                "SELECT '$1', \"$1\", $x$ $1 $x$, 'it''s $1' -- $1\n, $1 /* $1 */",
                &values
            ),
            "SELECT '$1', \"$1\", $x$ $1 $x$, 'it''s $1' -- $1\n, '7'::int8 /* $1 */"
        );
        let ten: Vec<Value> = (0..10).map(|n| Value::Int4(Some(n))).collect();
        assert_eq!(
            render(
                "SELECT $10, $1 || 'é', $2, $3, $4, $5, $6, $7, $8, $9",
                &ten
            )[..30],
            *"SELECT '9'::int4, '0'::int4 ||"
        );
    }

    #[test]
    fn statement_and_values_must_agree() {
        assert!(inline("SELECT $2", &[Value::Bool(true)]).is_err());
        assert!(inline("SELECT $0", &[Value::Bool(true)]).is_err());
        assert!(inline("SELECT 1", &[Value::Bool(true)]).is_err());
        assert!(inline("SELECT '$1'", &[Value::Bool(true)]).is_err());
        assert!(inline("SELECT $1", &[Value::Text("a\0b".into())]).is_err());
    }
}
