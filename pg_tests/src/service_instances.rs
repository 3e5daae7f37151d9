//! The deferred-deletion domain of the spec's first source system, as the
//! attached-table tests use it: a `service_instances` table whose
//! SCHEDULED rows are the queue, a `published` table standing for what the
//! broker received, and the two fenced writes a replica's handler makes.

use pg_lease_client::{FencingToken, Job};
use tokio_postgres::Client;

/// Creates `service_instances` with `scheduled` SCHEDULED rows, ids
/// counting from one, and `running` RUNNING ones after them; creates
/// `published`; attaches the table (`pending => status = 'SCHEDULED'`),
/// with `attach_options` appended to the call (e.g. `", backoff_base => '0'"`).
pub async fn create(pg: &Client, scheduled: i64, running: i64, attach_options: &str) {
    pg.batch_execute(&format!(
        "CREATE TABLE service_instances (id bigint PRIMARY KEY, status text NOT NULL);
         INSERT INTO service_instances
              SELECT g, CASE WHEN g <= {scheduled} THEN 'SCHEDULED' ELSE 'RUNNING' END
                FROM generate_series(1, {scheduled} + {running}) g;
         -- What the broker received: one row per publication.
         CREATE TABLE published (instance bigint, attempt text, at timestamptz DEFAULT clock_timestamp());
         SELECT lease.attach('service_instances', pending => $$status = 'SCHEDULED'$$ {attach_options});"
    ))
    .await
    .expect("service_instances");
}

/// The handler's first step: publishes row `key` with the attempt id as
/// the message id, only while the job's lease holds.
pub async fn publish_under_fence(
    domain: &Client,
    key: i64,
    job: &Job,
) -> Result<u64, tokio_postgres::Error> {
    let token = job.token();
    domain
        .execute(
            "INSERT INTO published (instance, attempt)
             SELECT $1, $2 WHERE lease.fence($3, $4) IS NOT NULL",
            &[&key, &job.attempt_id(), &token.id, &token.epoch],
        )
        .await
}

/// The handler's last step: row `key` leaves the queue by a write that
/// holds only under the lease.
pub async fn delete_under_fence(
    domain: &Client,
    key: i64,
    token: FencingToken,
) -> Result<u64, tokio_postgres::Error> {
    domain
        .execute(
            "UPDATE service_instances SET status = 'DELETED'
              WHERE id = $1 AND lease.fence($2, $3) IS NOT NULL",
            &[&key, &token.id, &token.epoch],
        )
        .await
}
