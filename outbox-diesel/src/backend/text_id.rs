//! The row MySQL and SQLite share: the id as text, the timestamps as the backend's type.

/// One row for MySQL and SQLite: the id as text, then the common columns, then `created_at`
/// and `available_at` (the same value) as `$ts`.
macro_rules! text_id_row {
    ($m:expr, $row:expr, $out:expr, $ts:ty) => {{
        let out = $out;
        out.push_sql("(");
        out.push_bind_param::<diesel::sql_types::Text, _>(&$row.id)?;
        bind_common!(&mut *out, $m, &$row.headers, "", "");
        out.push_sql(", ");
        out.push_bind_param::<$ts, _>(&$row.at)?;
        out.push_sql(", ");
        out.push_bind_param::<$ts, _>(&$row.at)?;
        out.push_sql(")");
        Ok(())
    }};
}

/// The computed values of a row for MySQL and SQLite.
#[doc(hidden)]
pub struct TextIdRow<T> {
    pub(crate) id: String,
    pub(crate) headers: String,
    pub(crate) at: T,
}
