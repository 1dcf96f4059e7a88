//! What `#[derive(OutboxEvent)]` generates, checked at run time: aggregate types, keys, event
//! types, versions, topics, `EVENT_TYPES`, and that serde's payload is left alone.

use outbox::{AggregateKey, EventType, OutboxEvent};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

const ORDER: Uuid = Uuid::from_u128(0x0193_5d1e_7a4c_7b3e_9f00_0000_0000_002a);
const ORDER_KEY: &str = "01935d1e-7a4c-7b3e-9f00-00000000002a";

/// Everything the trait says about one value, in one comparable tuple.
fn describe<E: OutboxEvent>(
    event: &E,
) -> (
    &'static str,
    String,
    &'static str,
    u32,
    Option<&'static str>,
) {
    (
        event.aggregate_type(),
        event.aggregate_id(),
        event.event_type(),
        event.event_version(),
        event.topic(),
    )
}

fn event_type(
    aggregate_type: &'static str,
    event_type: &'static str,
    version: u32,
    topic: Option<&'static str>,
) -> EventType {
    EventType {
        aggregate_type,
        event_type,
        version,
        topic,
    }
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 3)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: Uuid,
    total_cents: i64,
}

#[test]
fn struct_with_explicit_attributes() {
    let event = OrderCreated {
        order_id: ORDER,
        total_cents: 1250,
    };
    assert_eq!(OrderCreated::AGGREGATE_TYPE, "order");
    assert_eq!(
        describe(&event),
        ("order", ORDER_KEY.to_owned(), "OrderCreated", 3, None)
    );
    assert_eq!(
        OrderCreated::EVENT_TYPES,
        [event_type("order", "OrderCreated", 3, None)]
    );
    assert_eq!(event.total_cents, 1250);
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "customer", topic = "crm.customers-v1")]
struct CustomerRenamed {
    name: String,
    #[outbox(aggregate_id)]
    customer: String,
}

#[test]
fn struct_defaults_to_its_name_and_version_1_and_takes_a_topic() {
    let event = CustomerRenamed {
        name: "Ada".into(),
        customer: "c-17".into(),
    };
    assert_eq!(
        describe(&event),
        (
            "customer",
            "c-17".to_owned(),
            "CustomerRenamed",
            1,
            Some("crm.customers-v1")
        )
    );
    assert_eq!(
        CustomerRenamed::EVENT_TYPES,
        [event_type(
            "customer",
            "CustomerRenamed",
            1,
            Some("crm.customers-v1")
        )]
    );
    assert_eq!(event.name, "Ada");
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "account")]
struct Deposited(u64, #[outbox(aggregate_id)] i64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "account")]
struct Closed(#[outbox(aggregate_id)] u8);

#[test]
fn tuple_structs_and_integer_keys() {
    assert_eq!(
        describe(&Deposited(5, -42)),
        ("account", "-42".to_owned(), "Deposited", 1, None)
    );
    assert_eq!(
        describe(&Closed(255)),
        ("account", "255".to_owned(), "Closed", 1, None)
    );
}

/// An id newtype with its own key.
#[derive(Serialize)]
struct SkuId(u32);

impl AggregateKey for SkuId {
    fn to_key(&self) -> String {
        format!("sku-{:06}", self.0)
    }
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "sku")]
struct Restocked {
    #[outbox(aggregate_id)]
    sku: SkuId,
    quantity: u32,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "sku")]
struct Repriced<'a> {
    #[outbox(aggregate_id)]
    sku: &'a str,
    cents: u32,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "sku")]
struct Discontinued {
    #[outbox(aggregate_id)]
    sku: Box<SkuId>,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "sku")]
struct Relabelled {
    #[outbox(aggregate_id)]
    r#ref: Box<str>,
}

#[test]
fn newtype_reference_and_smart_pointer_keys() {
    let restocked = Restocked {
        sku: SkuId(42),
        quantity: 3,
    };
    assert_eq!(restocked.aggregate_id(), "sku-000042");
    assert_eq!(restocked.quantity, 3);
    let name = String::from("sku-7");
    let repriced = Repriced {
        sku: &name,
        cents: 99,
    };
    assert_eq!(
        describe(&repriced),
        ("sku", "sku-7".to_owned(), "Repriced", 1, None)
    );
    assert_eq!(repriced.cents, 99);
    let discontinued = Discontinued {
        sku: Box::new(SkuId(7)),
    };
    assert_eq!(discontinued.aggregate_id(), "sku-000007");
    let relabelled = Relabelled {
        r#ref: "x-1".into(),
    };
    assert_eq!(relabelled.aggregate_id(), "x-1");
}

#[derive(Serialize, Deserialize, OutboxEvent, Debug, PartialEq)]
#[outbox(aggregate = "order", version = 4, topic = "orders")]
enum OrderEvent {
    Paid {
        #[outbox(aggregate_id)]
        order_id: Uuid,
        amount: i64,
    },
    #[outbox(event_type = "OrderCancelled", version = 2)]
    Cancelled {
        reason: String,
        #[outbox(aggregate_id)]
        order_id: Uuid,
    },
    #[outbox(topic = "order-shipping")]
    Shipped(String, #[outbox(aggregate_id)] Uuid),
    #[outbox(event_type = "order.archived", version = 7, topic = "archive")]
    Archived(#[outbox(aggregate_id)] Uuid),
}

#[test]
fn enum_variants_are_event_types_in_declaration_order() {
    assert_eq!(OrderEvent::AGGREGATE_TYPE, "order");
    assert_eq!(
        OrderEvent::EVENT_TYPES,
        [
            event_type("order", "Paid", 4, Some("orders")),
            event_type("order", "OrderCancelled", 2, Some("orders")),
            event_type("order", "Shipped", 4, Some("order-shipping")),
            event_type("order", "order.archived", 7, Some("archive")),
        ]
    );
}

#[test]
fn enum_values_answer_for_their_variant() {
    let key = || ORDER_KEY.to_owned();
    let paid = OrderEvent::Paid {
        order_id: ORDER,
        amount: 10,
    };
    let cancelled = OrderEvent::Cancelled {
        reason: "changed mind".into(),
        order_id: ORDER,
    };
    let shipped = OrderEvent::Shipped("DHL".into(), ORDER);
    let archived = OrderEvent::Archived(ORDER);
    assert_eq!(describe(&paid), ("order", key(), "Paid", 4, Some("orders")));
    assert_eq!(
        describe(&cancelled),
        ("order", key(), "OrderCancelled", 2, Some("orders"))
    );
    assert_eq!(
        describe(&shipped),
        ("order", key(), "Shipped", 4, Some("order-shipping"))
    );
    assert_eq!(
        describe(&archived),
        ("order", key(), "order.archived", 7, Some("archive"))
    );
    // Each value's answers are the ones its `EVENT_TYPES` entry promises.
    for (value, descriptor) in [paid, cancelled, shipped, archived]
        .iter()
        .zip(OrderEvent::EVENT_TYPES)
    {
        assert_eq!(value.event_type(), descriptor.event_type);
        assert_eq!(value.event_version(), descriptor.version);
        assert_eq!(value.topic(), descriptor.topic);
        assert_eq!(value.aggregate_type(), descriptor.aggregate_type);
    }
}

/// The same enum as [`OrderEvent`] without the derive, to compare serde's output with.
#[derive(Serialize)]
enum PlainOrderEvent {
    Paid { order_id: Uuid, amount: i64 },
    Cancelled { reason: String, order_id: Uuid },
    Shipped(String, Uuid),
    Archived(Uuid),
}

#[test]
fn serde_payload_of_an_enum_is_unchanged() {
    let pairs = [
        (
            OrderEvent::Paid {
                order_id: ORDER,
                amount: 10,
            },
            PlainOrderEvent::Paid {
                order_id: ORDER,
                amount: 10,
            },
        ),
        (
            OrderEvent::Cancelled {
                reason: "r".into(),
                order_id: ORDER,
            },
            PlainOrderEvent::Cancelled {
                reason: "r".into(),
                order_id: ORDER,
            },
        ),
        (
            OrderEvent::Shipped("DHL".into(), ORDER),
            PlainOrderEvent::Shipped("DHL".into(), ORDER),
        ),
        (
            OrderEvent::Archived(ORDER),
            PlainOrderEvent::Archived(ORDER),
        ),
    ];
    for (derived, plain) in &pairs {
        let json = serde_json::to_value(derived).unwrap();
        assert_eq!(json, serde_json::to_value(plain).unwrap());
        let back: OrderEvent = serde_json::from_value(json).unwrap();
        assert_eq!(&back, derived);
    }
    assert_eq!(
        serde_json::to_string(&pairs[0].0).unwrap(),
        format!(r#"{{"Paid":{{"order_id":"{ORDER_KEY}","amount":10}}}}"#)
    );
}

#[derive(Serialize, OutboxEvent)]
#[serde(tag = "type", rename_all = "snake_case")]
#[outbox(aggregate = "invoice")]
enum InvoiceEvent {
    Issued {
        #[outbox(aggregate_id)]
        #[serde(rename = "invoice")]
        invoice_id: u64,
    },
    Voided {
        #[outbox(aggregate_id)]
        invoice_id: u64,
    },
}

#[test]
fn serde_attributes_shape_the_payload_not_the_event_type() {
    let issued = InvoiceEvent::Issued { invoice_id: 9 };
    assert_eq!(
        serde_json::to_value(&issued).unwrap(),
        serde_json::json!({"type": "issued", "invoice": 9})
    );
    assert_eq!(
        describe(&issued),
        ("invoice", "9".to_owned(), "Issued", 1, None)
    );
    let voided = InvoiceEvent::Voided { invoice_id: 10 };
    assert_eq!(
        describe(&voided),
        ("invoice", "10".to_owned(), "Voided", 1, None)
    );
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "tenant")]
struct Tagged<Id, P>
where
    P: Clone,
{
    #[outbox(aggregate_id)]
    id: Id,
    payload: P,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "tenant")]
enum TenantEvent<T> {
    Created {
        #[outbox(aggregate_id)]
        id: u32,
        data: T,
    },
}

#[test]
fn generic_events() {
    let by_number = Tagged {
        id: 5_u64,
        payload: vec![1, 2],
    };
    assert_eq!(
        describe(&by_number),
        ("tenant", "5".to_owned(), "Tagged", 1, None)
    );
    let by_name = Tagged {
        id: String::from("acme"),
        payload: "x",
    };
    assert_eq!(by_name.aggregate_id(), "acme");
    assert_eq!(by_number.payload.len() + by_name.payload.len(), 3);
    let created = TenantEvent::Created {
        id: 3,
        data: [0u8; 2],
    };
    assert_eq!(
        describe(&created),
        ("tenant", "3".to_owned(), "Created", 1, None)
    );
    assert_eq!(
        TenantEvent::<()>::EVENT_TYPES,
        [event_type("tenant", "Created", 1, None)]
    );
}

mod renamed {
    // The inner crate, reached through `crate = ...`, as a user who depends on it only would.
    use outbox_core::OutboxEvent;

    #[derive(serde::Serialize, OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "cart")]
    pub struct CartEmptied {
        #[outbox(aggregate_id)]
        pub cart: u16,
    }

    #[derive(serde::Serialize, OutboxEvent)]
    #[outbox(aggregate = "cart", crate = "::outbox_core")]
    pub struct CartFilled(#[outbox(aggregate_id)] pub u16);
}

#[test]
fn crate_override() {
    assert_eq!(describe(&renamed::CartEmptied { cart: 1 }).2, "CartEmptied");
    assert_eq!(describe(&renamed::CartFilled(2)).1, "2");
}

/// `EVENT_TYPES` is usable in constant context, e.g. to build a dispatch table at compile time.
const ALL_ORDER_EVENTS: &[EventType] = OrderEvent::EVENT_TYPES;

#[test]
fn event_types_are_constants() {
    assert_eq!(ALL_ORDER_EVENTS.len(), 4);
    assert!(ALL_ORDER_EVENTS.iter().all(|t| t.aggregate_type == "order"));
}
