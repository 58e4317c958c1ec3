//! Values between the manifest's dialect layer and PostgreSQL: SQLite's five types as
//! parameters (converted to the type the server asks for: an integer to a `boolean`, a text to
//! `json`) and from rows.

use bytes::BytesMut;
use rusqlite::types::Value;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};

use crate::pg::error::{Error as PgError, Result as PgResult};

/// Rows as SQLite's values.
pub(super) fn values_of(rows: &[tokio_postgres::Row]) -> PgResult<Vec<Vec<Value>>> {
    rows.iter()
        .map(|r| {
            (0..r.len())
                .map(|i| {
                    r.try_get::<_, Read>(i)
                        .map(|c| c.0)
                        .map_err(|e| PgError::from(&e))
                })
                .collect()
        })
        .collect()
}

/// Values as a statement's parameters.
pub(super) fn params_of(values: &[Value]) -> Vec<Param<'_>> {
    values.iter().map(Param).collect()
}

/// Parameters as the driver takes them.
pub(super) fn refs<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// A value passed to PostgreSQL as the type the server asks for.
#[derive(Debug)]
pub(super) struct Param<'a>(&'a Value);

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let v = self.0;
        match (v, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Integer(i), &Type::INT8) => i.to_sql(ty, out),
            (Value::Integer(i), &Type::INT4) => i32::try_from(*i)?.to_sql(ty, out),
            (Value::Integer(i), &Type::INT2) => i16::try_from(*i)?.to_sql(ty, out),
            (Value::Integer(i), &Type::BOOL) => (*i != 0).to_sql(ty, out),
            #[expect(
                clippy::cast_precision_loss,
                reason = "an integer where the server asks for a double, converted as SQLite converts it"
            )]
            (Value::Integer(i), &Type::FLOAT8) => (*i as f64).to_sql(ty, out),
            (Value::Integer(i), t) if is_text(t) => i.to_string().as_str().to_sql(&Type::TEXT, out),
            (Value::Real(f), &Type::FLOAT8) => f.to_sql(ty, out),
            (Value::Text(s), t) if is_text(t) => {
                escape_into(s, out);
                Ok(IsNull::No)
            }
            (Value::Blob(b), &Type::BYTEA) => b.as_slice().to_sql(ty, out),
            (v, t) => Err(format!("cannot pass {:?} as PostgreSQL type {t}", v.data_type()).into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// What stands for a NUL character in PostgreSQL's text, which cannot hold one, and for
/// itself: the noncharacter U+FFFF, then `0` for a NUL or U+FFFF again for itself. A text
/// holding neither (every text the program writes itself) is stored as it is; one holding
/// either (a task's fingerprint, say, or an error quoting hostile data) reads back exactly as
/// it was written, as on SQLite, and compares equal in a statement to the same text passed as
/// a parameter.
const ESCAPE: char = '\u{FFFF}';

/// Writes `s` as PostgreSQL's text holds it (see [`ESCAPE`]).
fn escape_into(s: &str, out: &mut BytesMut) {
    if !s.contains(['\0', ESCAPE]) {
        out.extend_from_slice(s.as_bytes());
        return;
    }
    let mut buf = [0; 4];
    for c in s.chars() {
        match c {
            '\0' => {
                out.extend_from_slice(ESCAPE.encode_utf8(&mut buf).as_bytes());
                out.extend_from_slice(b"0");
            }
            ESCAPE => {
                out.extend_from_slice(ESCAPE.encode_utf8(&mut buf).as_bytes());
                out.extend_from_slice(ESCAPE.encode_utf8(&mut buf).as_bytes());
            }
            c => out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
        }
    }
}

/// The text PostgreSQL holds, as it was written (see [`ESCAPE`]).
fn unescape(s: String) -> String {
    if !s.contains(ESCAPE) {
        return s;
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (c, c == ESCAPE) {
            (_, true) => match chars.next() {
                Some('0') => out.push('\0'),
                Some(ESCAPE) => out.push(ESCAPE),
                // Not written by this program: kept as it is.
                Some(other) => {
                    out.push(ESCAPE);
                    out.push(other);
                }
                None => out.push(ESCAPE),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

/// Types read and written as text: `json` is the document as it was written.
fn is_text(t: &Type) -> bool {
    [
        Type::TEXT,
        Type::JSON,
        Type::VARCHAR,
        Type::BPCHAR,
        Type::NAME,
        Type::UNKNOWN,
    ]
    .contains(t)
}

/// A value read from PostgreSQL, as SQLite's type.
struct Read(Value);

impl<'a> FromSql<'a> for Read {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Read(match *ty {
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
            Type::OID => Value::Integer(u32::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Integer(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::BYTEA => Value::Blob(raw.to_vec()),
            ref t if is_text(t) => Value::Text(unescape(String::from_sql(&Type::TEXT, raw)?)),
            ref t => return Err(format!("the manifest reads no PostgreSQL type {t}").into()),
        }))
    }

    fn from_sql_null(
        _: &Type,
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Read(Value::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}
