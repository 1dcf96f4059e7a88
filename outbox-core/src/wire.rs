//! The payload on the wire: an event's own fields, whether it was declared as a struct or as a
//! variant of an enum.
//!
//! serde writes a variant of an (externally tagged) enum wrapped in the variant's name,
//! `{"OrderPlaced":{"order_id":7}}`. On the wire that wrapper is Rust-specific noise, and it
//! breaks every reader that did not decode the same Rust enum: another service declaring just
//! `OrderPlaced` as a struct, a program in another language, the JSON Schema a reader is
//! given. The event type is already a header, so the wrapper says nothing new. [`encode`]
//! leaves it out; [`decode`] puts it back from the event type before the enum decodes, and
//! still decodes payloads written in the wrapped form.
//!
//! Both find out what serde does from serde itself, not from the attributes: encoding asks the
//! value whether it serialises as a variant (and under which name), decoding asks the type
//! whether it deserialises as an externally tagged enum (and which variant names it has, in
//! declaration order, as [`OutboxEvent::EVENT_TYPES`] lists the event types). Internally or
//! adjacently tagged and untagged enums carry no wrapper and are written as serde writes them.

use std::fmt;

use serde::de::{self, DeserializeOwned, Visitor};
use serde::ser::{self, Impossible, Serialize};

use crate::{EventType, OutboxEvent};

/// The JSON payload of `event`: serde's JSON, without the wrapper of an enum variant.
pub(crate) fn encode<E: Serialize + ?Sized>(event: &E) -> serde_json::Result<String> {
    let json = serde_json::to_string(event)?;
    let Some(variant) = variant_of(event) else {
        return Ok(json);
    };
    // serde_json writes a variant as `{` + the name as a JSON string + `:` + its content + `}`.
    let prefix = format!("{{{}:", serde_json::to_string(variant)?);
    match json.strip_prefix(&prefix).and_then(|j| j.strip_suffix('}')) {
        Some(content) => Ok(content.to_owned()),
        // A unit variant (`"Name"`): nothing to unwrap.
        None => Ok(json),
    }
}

/// Decodes the payload of an event of type `event_type` as `E`: through the variant of
/// `event_type` when `E` is an externally tagged enum (the payload then holds the variant's
/// content), else as serde reads it. A payload in the wrapped form (`{"Variant":{…}}`, as
/// written before the wrapper was left out) decodes too.
pub(crate) fn decode<E: OutboxEvent + DeserializeOwned>(
    event_type: &str,
    payload: &[u8],
) -> serde_json::Result<E> {
    decode_as(E::EVENT_TYPES, event_type, payload)
}

/// [`decode`] for a type whose event types are `types`.
pub(crate) fn decode_as<E: DeserializeOwned>(
    types: &[EventType],
    event_type: &str,
    payload: &[u8],
) -> serde_json::Result<E> {
    let variant = variants_of::<E>().and_then(|names| {
        // The derive lists an enum's event types in the order of its variants; a skipped
        // variant (absent from serde's names) makes the two lists differ, and then the payload
        // is read as serde reads it.
        (names.len() == types.len())
            .then(|| types.iter().position(|t| t.event_type == event_type))
            .flatten()
            .map(|i| names[i])
    });
    let Some(variant) = variant else {
        return serde_json::from_slice(payload);
    };
    let name = serde_json::to_string(variant)?;
    let mut wrapped = Vec::with_capacity(payload.len() + name.len() + 3);
    wrapped.push(b'{');
    wrapped.extend_from_slice(name.as_bytes());
    wrapped.push(b':');
    wrapped.extend_from_slice(payload);
    wrapped.push(b'}');
    match serde_json::from_slice(&wrapped) {
        Ok(event) => Ok(event),
        // The wrapped form: the payload is the whole enum.
        Err(e) => serde_json::from_slice(payload).map_err(|_| e),
    }
}

/// The serde name of the variant `value` serialises as, if it serialises as one.
fn variant_of<T: Serialize + ?Sized>(value: &T) -> Option<&'static str> {
    match value.serialize(Probe) {
        Err(Probed::Variant(name)) => Some(name),
        _ => None,
    }
}

/// The variant names of `T` when it deserialises as an externally tagged enum.
fn variants_of<T: DeserializeOwned>() -> Option<&'static [&'static str]> {
    match T::deserialize(Probe) {
        Err(Probed::Variants(names)) => Some(names),
        _ => None,
    }
}

/// A serializer and deserializer that stop at the first call, saying what it was.
struct Probe;

/// What [`Probe`] found out (its "error").
#[derive(Debug)]
enum Probed {
    /// The value serialises as this variant.
    Variant(&'static str),
    /// The type deserialises as an externally tagged enum with these variants.
    Variants(&'static [&'static str]),
    /// Anything else.
    Other,
}

impl fmt::Display for Probed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("probed")
    }
}

impl std::error::Error for Probed {}

impl ser::Error for Probed {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Probed::Other
    }
}

impl de::Error for Probed {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Probed::Other
    }
}

macro_rules! other {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {$(
        fn $method(self, $(_: $arg),*) -> Result<Self::Ok, Probed> {
            Err(Probed::Other)
        }
    )*};
}

impl ser::Serializer for Probe {
    type Ok = ();
    type Error = Probed;
    type SerializeSeq = Impossible<(), Probed>;
    type SerializeTuple = Impossible<(), Probed>;
    type SerializeTupleStruct = Impossible<(), Probed>;
    type SerializeTupleVariant = Impossible<(), Probed>;
    type SerializeMap = Impossible<(), Probed>;
    type SerializeStruct = Impossible<(), Probed>;
    type SerializeStructVariant = Impossible<(), Probed>;

    other!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
    );

    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), Probed> {
        Err(Probed::Other)
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Probed> {
        Err(Probed::Variant(variant))
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), Probed> {
        Err(Probed::Other)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: &T,
    ) -> Result<(), Probed> {
        Err(Probed::Variant(variant))
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Probed> {
        Err(Probed::Other)
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Probed> {
        Err(Probed::Other)
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Probed> {
        Err(Probed::Other)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Probed> {
        Err(Probed::Variant(variant))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Probed> {
        Err(Probed::Other)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Probed> {
        Err(Probed::Other)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Probed> {
        Err(Probed::Variant(variant))
    }
}

impl<'de> de::Deserializer<'de> for Probe {
    type Error = Probed;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Probed> {
        Err(Probed::Other)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Probed> {
        Err(Probed::Variants(variants))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::{decode, encode};
    use crate as outbox_core;
    use crate::OutboxEvent;

    #[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "order")]
    enum OrderEvent {
        OrderPlaced {
            #[outbox(aggregate_id)]
            order_id: u64,
            total_cents: i64,
        },
        #[serde(rename = "cancelled")]
        #[outbox(event_type = "OrderCancelled")]
        Cancelled {
            #[outbox(aggregate_id)]
            order_id: u64,
        },
        Noted(#[outbox(aggregate_id)] u64, String),
    }

    /// What another service declares for one event of the topic.
    #[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "order")]
    struct OrderPlaced {
        #[outbox(aggregate_id)]
        order_id: u64,
        total_cents: i64,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "order")]
    #[serde(tag = "type")]
    enum Tagged {
        TaggedPlaced {
            #[outbox(aggregate_id)]
            order_id: u64,
        },
    }

    #[test]
    fn an_enum_variant_is_written_as_its_own_fields() {
        let placed = OrderEvent::OrderPlaced {
            order_id: 7,
            total_cents: 1250,
        };
        let json = encode(&placed).unwrap();
        assert_eq!(json, r#"{"order_id":7,"total_cents":1250}"#);
        // Exactly what the struct another service declares writes and reads.
        let struct_json = encode(&OrderPlaced {
            order_id: 7,
            total_cents: 1250,
        })
        .unwrap();
        assert_eq!(json, struct_json);
        let theirs: OrderPlaced = decode("OrderPlaced", json.as_bytes()).unwrap();
        assert_eq!(theirs.total_cents, 1250);
        // And the enum reads it back.
        assert_eq!(
            decode::<OrderEvent>("OrderPlaced", json.as_bytes()).unwrap(),
            placed
        );
        // Renamed variants, tuple variants.
        let cancelled = OrderEvent::Cancelled { order_id: 7 };
        assert_eq!(encode(&cancelled).unwrap(), r#"{"order_id":7}"#);
        assert_eq!(
            decode::<OrderEvent>("OrderCancelled", br#"{"order_id":7}"#).unwrap(),
            cancelled
        );
        let noted = OrderEvent::Noted(7, "gift".into());
        assert_eq!(encode(&noted).unwrap(), r#"[7,"gift"]"#);
        assert_eq!(
            decode::<OrderEvent>("Noted", br#"[7,"gift"]"#).unwrap(),
            noted
        );
    }

    #[test]
    fn the_wrapped_form_still_decodes() {
        let old = br#"{"OrderPlaced":{"order_id":7,"total_cents":1250}}"#;
        assert_eq!(
            decode::<OrderEvent>("OrderPlaced", old).unwrap(),
            OrderEvent::OrderPlaced {
                order_id: 7,
                total_cents: 1250
            }
        );
        assert_eq!(
            decode::<OrderEvent>("OrderCancelled", br#"{"cancelled":{"order_id":7}}"#).unwrap(),
            OrderEvent::Cancelled { order_id: 7 }
        );
    }

    #[test]
    fn a_payload_that_fits_no_form_reports_the_variants_error() {
        let err = decode::<OrderEvent>("OrderPlaced", br#"{"order_id":7}"#).unwrap_err();
        assert!(err.to_string().contains("total_cents"), "{err}");
    }

    #[test]
    fn tagged_enums_and_structs_are_written_as_serde_writes_them() {
        let tagged = Tagged::TaggedPlaced { order_id: 3 };
        let json = encode(&tagged).unwrap();
        assert_eq!(json, serde_json::to_string(&tagged).unwrap());
        assert_eq!(
            decode::<Tagged>("TaggedPlaced", json.as_bytes()).unwrap(),
            tagged
        );
    }
}
