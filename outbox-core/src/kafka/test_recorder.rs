//! A `metrics` recorder for unit tests: counts each counter by name and labels, to be
//! installed with `metrics::with_local_recorder`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};

/// Counters (and gauges, by their last value) as `name{label=value,...}`, labels sorted.
#[derive(Default)]
pub(crate) struct CountingRecorder {
    values: Arc<Mutex<BTreeMap<String, Arc<Value>>>>,
}

#[derive(Default)]
pub(crate) struct Value(AtomicU64);

impl CountingRecorder {
    /// Every counter and gauge recorded, with its value.
    pub(crate) fn counts(&self) -> Vec<(String, u64)> {
        let values = self.values.lock().unwrap();
        values
            .iter()
            .map(|(k, v)| (k.clone(), v.0.load(Ordering::Relaxed)))
            .collect()
    }

    fn value(&self, key: &Key) -> Arc<Value> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.values.lock().unwrap().entry(name).or_default().clone()
    }
}

impl CounterFn for Value {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

impl GaugeFn for Value {
    fn increment(&self, value: f64) {
        self.0.fetch_add(value as u64, Ordering::Relaxed);
    }
    fn decrement(&self, value: f64) {
        self.0.fetch_sub(value as u64, Ordering::Relaxed);
    }
    fn set(&self, value: f64) {
        self.0.store(value as u64, Ordering::Relaxed);
    }
}

impl Recorder for CountingRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.value(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.value(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
