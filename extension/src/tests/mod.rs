//! `#[pg_test]`s: the semantics and the error cases of every SQL function.
//! Each test runs inside one transaction that is rolled back afterwards, so
//! the tests drive the database clock forward with `pg_sleep` and never see
//! the background workers.
//!
//! One file per concept, each with its own `#[pg_schema] mod tests` (pgrx
//! runs every `#[pg_test]` from schema `tests`).

mod attach;
mod catalog;
mod claim;
mod concurrency;
mod fence;
mod lease;
mod named;
mod queue;
mod reap;
mod schedule;
mod support;
