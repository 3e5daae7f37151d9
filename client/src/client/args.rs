//! The arguments of the enqueue calls, converted once and bound the same
//! way by the [`Client`](super::Client)'s prepared statements and by the
//! functions over a caller's transaction ([`tx`](super::tx)).

use serde::Serialize;
use tokio_postgres::types::ToSql;

use super::rows::micros;
use crate::error::Result;
use crate::queue::{BatchOptions, EnqueueOptions};

/// One parameter of a statement.
type Param<'a> = &'a (dyn ToSql + Sync);

/// `lease.enqueue`'s arguments, in `Query::Enqueue`'s order.
pub(super) struct Enqueue<'a> {
    pub(super) queue: &'a str,
    pub(super) payload: serde_json::Value,
    pub(super) key: Option<&'a str>,
    pub(super) delay: Option<i64>,
    pub(super) priority: i32,
    pub(super) unique_key: Option<&'a str>,
    pub(super) concurrency_key: Option<&'a str>,
    pub(super) fairness_key: Option<&'a str>,
}

impl<'a> Enqueue<'a> {
    /// Serializes `payload` and checks the options.
    pub(super) fn new<P: Serialize + ?Sized>(
        queue: &'a str,
        payload: &P,
        options: &'a EnqueueOptions,
    ) -> Result<Enqueue<'a>> {
        Ok(Enqueue {
            queue,
            payload: serde_json::to_value(payload)?,
            key: options.key.as_deref(),
            delay: options.delay.map(|d| micros(d, "delay")).transpose()?,
            priority: options.priority,
            unique_key: options.unique_key.as_deref(),
            concurrency_key: options.concurrency_key.as_deref(),
            fairness_key: options.fairness_key.as_deref(),
        })
    }

    /// The parameters.
    pub(super) fn params(&self) -> [Param<'_>; 8] {
        [
            &self.queue,
            &self.payload,
            &self.key,
            &self.delay,
            &self.priority,
            &self.unique_key,
            &self.concurrency_key,
            &self.fairness_key,
        ]
    }
}

/// `lease.enqueue_batch`'s arguments, in `Query::EnqueueBatch`'s order.
pub(super) struct EnqueueBatch<'a> {
    pub(super) queue: &'a str,
    pub(super) payloads: Vec<serde_json::Value>,
    pub(super) keys: Option<&'a Vec<Option<String>>>,
    pub(super) delay: Option<i64>,
    pub(super) priority: i32,
    pub(super) concurrency_keys: Option<&'a Vec<Option<String>>>,
    pub(super) fairness_keys: Option<&'a Vec<Option<String>>>,
}

impl<'a> EnqueueBatch<'a> {
    /// Serializes `payloads` and checks the options.
    pub(super) fn new<P: Serialize>(
        queue: &'a str,
        payloads: &[P],
        options: &'a BatchOptions,
    ) -> Result<EnqueueBatch<'a>> {
        Ok(EnqueueBatch {
            queue,
            payloads: payloads
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<Vec<_>, _>>()?,
            keys: options.keys.as_ref(),
            delay: options.delay.map(|d| micros(d, "delay")).transpose()?,
            priority: options.priority,
            concurrency_keys: options.concurrency_keys.as_ref(),
            fairness_keys: options.fairness_keys.as_ref(),
        })
    }

    /// The parameters.
    pub(super) fn params(&self) -> [Param<'_>; 7] {
        [
            &self.queue,
            &self.payloads,
            &self.keys,
            &self.delay,
            &self.priority,
            &self.concurrency_keys,
            &self.fairness_keys,
        ]
    }
}
