//! [`CreatedAt`]: a claimed row's `created_at` that never fails the claim.
//!
//! Each backend can hold a `created_at` that no `DateTime<Utc>` represents: PostgreSQL's
//! `infinity` (and years past chrono's range), MySQL's zero date, SQLite text in no date
//! format. Decoded as `DateTime<Utc>`, such a value fails the whole statement, and the relay
//! would take a bad row for a database outage, claiming the same rows again and publishing
//! none. Decoded as [`CreatedAt`], it makes that one row malformed: dead-lettered with the
//! value in its `last_error`, while the rest of the claim is published.

use chrono::{DateTime, Utc};

/// A row's `created_at`: the time, or the stored value (as text) when it is no time the
/// relay can represent.
#[derive(Debug)]
pub(crate) struct CreatedAt(pub Result<DateTime<Utc>, String>);

#[cfg(feature = "postgres_backend")]
mod pg {
    use chrono::{DateTime, Utc};
    use diesel::deserialize::{self, FromSql};
    use diesel::pg::{Pg, PgValue};
    use diesel::sql_types::Timestamptz;

    use super::CreatedAt;

    impl FromSql<Timestamptz, Pg> for CreatedAt {
        fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
            let time = <DateTime<Utc> as FromSql<Timestamptz, Pg>>::from_sql(value);
            Ok(CreatedAt(time.map_err(|_| raw(value.as_bytes()))))
        }
    }

    /// A binary `timestamptz` as PostgreSQL would print it where chrono cannot: microseconds
    /// since 2000-01-01, with the two infinities by name.
    fn raw(bytes: &[u8]) -> String {
        match <[u8; 8]>::try_from(bytes).map(i64::from_be_bytes) {
            Ok(i64::MAX) => "infinity".to_owned(),
            Ok(i64::MIN) => "-infinity".to_owned(),
            Ok(micros) => format!("{micros} microseconds after 2000-01-01 00:00:00+00"),
            Err(_) => format!("{} bytes that are no timestamptz", bytes.len()),
        }
    }
}

#[cfg(feature = "mysql_backend")]
mod mysql {
    use chrono::NaiveDate;
    use diesel::deserialize::{self, FromSql};
    use diesel::mysql::data_types::MysqlTime;
    use diesel::mysql::{Mysql, MysqlValue};
    use diesel::sql_types::Timestamp;

    use super::CreatedAt;

    impl FromSql<Timestamp, Mysql> for CreatedAt {
        fn from_sql(value: MysqlValue<'_>) -> deserialize::Result<Self> {
            let t = <MysqlTime as FromSql<Timestamp, Mysql>>::from_sql(value)?;
            let time = i32::try_from(t.year)
                .ok()
                .and_then(|year| NaiveDate::from_ymd_opt(year, t.month, t.day))
                .zip(u32::try_from(t.second_part).ok())
                .and_then(|(date, micros)| {
                    date.and_hms_micro_opt(t.hour, t.minute, t.second, micros)
                })
                .map(|time| time.and_utc());
            Ok(CreatedAt(time.ok_or_else(|| {
                format!(
                    "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
                    t.year, t.month, t.day, t.hour, t.minute, t.second, t.second_part
                )
            })))
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use diesel::deserialize::{self, FromSql};
    use diesel::sql_types::{Text, Timestamp};
    use diesel::sqlite::{Sqlite, SqliteValue};

    use super::{CreatedAt, parse_sqlite};

    impl FromSql<Timestamp, Sqlite> for CreatedAt {
        fn from_sql(value: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
            let text = <String as FromSql<Text, Sqlite>>::from_sql(value)?;
            Ok(CreatedAt(parse_sqlite(&text).ok_or(text)))
        }
    }
}

/// A `created_at` stored in SQLite, as Diesel reads a `Timestamp` there: text in one of its
/// formats (ours is the first), or a Julian day number.
#[cfg(feature = "sqlite")]
fn parse_sqlite(text: &str) -> Option<DateTime<Utc>> {
    const FORMATS: [&str; 18] = [
        "%F %T%.f",
        "%F %T%.f%:z",
        "%F %T",
        "%F %T%:z",
        "%F %R",
        "%F %RZ",
        "%F %R%:z",
        "%F %TZ",
        "%F %T%.fZ",
        "%FT%R",
        "%FT%RZ",
        "%FT%R%:z",
        "%FT%T",
        "%FT%TZ",
        "%FT%T%:z",
        "%FT%T%.f",
        "%FT%T%.fZ",
        "%FT%T%.f%:z",
    ];
    if let Some(time) = FORMATS
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(text, f).ok())
    {
        return Some(time.and_utc());
    }
    // Julian days: 2440587.5 is the Unix epoch.
    let days = text.parse::<f64>().ok().filter(|d| d.is_finite())?;
    let micros = (days - 2_440_587.5) * 86_400_000_000.0;
    if micros.abs() > i64::MAX as f64 {
        return None;
    }
    DateTime::from_timestamp_micros(micros as i64)
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::parse_sqlite;

    #[test]
    fn sqlite_text_parses_as_diesel_reads_it() {
        let t = parse_sqlite("2024-05-06 07:08:09.123456").unwrap();
        assert_eq!(t.to_rfc3339(), "2024-05-06T07:08:09.123456+00:00");
        assert_eq!(
            parse_sqlite("2024-05-06T07:08:09Z").unwrap().to_rfc3339(),
            "2024-05-06T07:08:09+00:00"
        );
        assert_eq!(
            parse_sqlite("2440587.5").unwrap().to_rfc3339(),
            "1970-01-01T00:00:00+00:00"
        );
        for bad in ["yesterday", "", "NaN", "1e300", "2024-13-01 00:00:00"] {
            assert_eq!(parse_sqlite(bad), None, "{bad}");
        }
    }
}
