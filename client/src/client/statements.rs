//! The client's SQL: one statement per call, each naming the function's
//! arguments (`limit => $1`), so that a statement reads like the SQL
//! reference and an argument can never land in the wrong position. Each
//! parameter carries a cast (`$1::text`): the server types it from there
//! when the statement is prepared, and [`Query::param_types`] reads the same
//! casts for a statement sent unprepared.
//! Durations travel as microseconds (`bigint`): tokio-postgres has no
//! `interval` mapping, and the server builds the interval, so no client
//! clock is involved.
//!
//! A set-returning call is read in the order the function returns its rows
//! (every one documents that order, and the batch calls check it): a call
//! written `WITH ORDINALITY` cannot be forwarded whole by Citus, whose
//! deparsed command loses the ordinality column ("a column definition list
//! is required").

/// Declares [`Query`] and the list of all its variants.
macro_rules! queries {
    ($($name:ident,)*) => {
        /// The statements, by name.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(super) enum Query {
            $($name,)*
        }

        impl Query {
            /// Every statement, in declaration order (`q as usize` indexes it).
            pub(super) const ALL: &'static [Query] = &[$(Query::$name,)*];
        }
    };
}

queries! {
    Enqueue,
    EnqueueBatch,
    Claim,
    Reclaim,
    Renew,
    RenewBatch,
    Release,
    ReleaseBatch,
    ReleaseAndClaim,
    FencedUpdate,
    Cancel,
    TryAcquire,
    RenewNamed,
    ReleaseNamed,
    CreateQueue,
    DropQueue,
    Reap,
    Purge,
    QueueStats,
    Metrics,
    InFlight,
    FairnessKeys,
    Holders,
    CancelKey,
    Requeue,
    ReleaseNamedBatch,
    Grant,
    Revoke,
    DeadLetters,
    ReaperStats,
    QueueSettings,
    Jobs,
    JobByKey,
    Job,
    ExtensionVersions,
    Schedule,
    SweepFenced,
    Unschedule,
    ApplyWriteBacks,
    Schedules,
    Pause,
    Resume,
    PurgeDead,
    JobSummaries,
    JobSummaryByKey,
    JobPreview,
    DeadLetterSummaries,
    RateWait,
    SetWeight,
    SetKeyRate,
    WaitReason,
}

use std::sync::OnceLock;

use tokio_postgres::types::{ToSql, Type};

/// `$n` microseconds from now by the database clock, or NULL.
macro_rules! at_or_null {
    ($n:literal) => {
        concat!(
            "CASE WHEN $",
            $n,
            "::bigint IS NULL THEN NULL ELSE clock_timestamp() + $",
            $n,
            "::bigint * interval '1 microsecond' END"
        )
    };
}

/// `$n` microseconds as an interval.
macro_rules! micros {
    ($n:literal) => {
        concat!("$", $n, "::bigint * interval '1 microsecond'")
    };
}

/// Every column of `lease.job`, in the order `admin::job_record` reads them.
macro_rules! job_columns {
    () => {
        concat!(
            "SELECT id, queue, key, payload, state::text, priority, rank, next_at, attempt, epoch, ",
            "owner, lease_until, cancel_requested, last_error, created_at, finished_at, unique_key ",
            "FROM lease.job "
        )
    };
}

/// `last_error` cut after 2,000 characters, marked by `…`: a release may
/// record an error of any length, and a listing shows its first line.
macro_rules! cut_error {
    () => {
        "CASE WHEN length(last_error) > 2000 THEN left(last_error, 2000) || '…' ELSE last_error END"
    };
}

/// The columns of `lease.job` but the payload, `last_error` cut, in the
/// order `summaries::job_summary` reads them; without `FROM`.
macro_rules! job_summary_select {
    () => {
        concat!(
            "SELECT id, queue, key, state::text, priority, rank, next_at, attempt, epoch, ",
            "owner, lease_until, cancel_requested, ",
            cut_error!(),
            ", created_at, finished_at, unique_key "
        )
    };
}

/// [`job_summary_select!`] from `lease.job`.
macro_rules! job_summary_columns {
    () => {
        concat!(job_summary_select!(), "FROM lease.job ")
    };
}

/// A page of `lease.job` rows: `$3` of them with ids above `$4`, of queue
/// `$1` (or all), in state `$2` (or any). One branch per state, each
/// comparing `state` with a literal, since only a literal lets the planner
/// use that state's partial index (`job_leased`, `job_dead_or_cancelled`):
/// a page of the few dead rows of a big queue then reads those rows, not
/// the queue.
/// The statement is planned for its arguments on every call (see
/// [`Query::planned_per_call`]), which drops the other branches.
/// `$columns` names the macro of the columns selected.
macro_rules! jobs_in_states {
    ($columns:ident) => {
        concat!(
            jobs_in_states!(@branch $columns "$2::text IS NULL"),
            jobs_in_states!(@in $columns "pending"),
            jobs_in_states!(@in $columns "leased"),
            jobs_in_states!(@in $columns "done"),
            jobs_in_states!(@in $columns "dead"),
            jobs_in_states!(@in $columns "cancelled"),
            "ORDER BY id LIMIT $3::bigint"
        )
    };
    (@in $columns:ident $state:literal) => {
        concat!(
            "UNION ALL ",
            jobs_in_states!(@branch $columns concat!("$2::text = '", $state, "' AND state = '", $state, "'"))
        )
    };
    (@branch $columns:ident $state:expr) => {
        concat!(
            "(", $columns!(), "WHERE ", $state, " AND ($1::text IS NULL OR queue = $1::text) ",
            "AND id > $4::bigint ORDER BY id LIMIT $3::bigint) "
        )
    };
}

/// An interval column as microseconds.
macro_rules! as_micros {
    ($col:literal) => {
        concat!("(extract(epoch FROM ", $col, ") * 1000000)::bigint")
    };
}

impl Query {
    /// How many statements there are (one prepared-statement slot each).
    pub(super) const COUNT: usize = Query::ALL.len();

    /// The type of each parameter (`$1` first), read from the cast the SQL
    /// puts on it (`$2::jsonb`): what a statement sent unprepared carries
    /// instead of a server-side description.
    pub(super) fn param_types(self) -> &'static [Type] {
        static TYPES: OnceLock<Vec<Vec<Type>>> = OnceLock::new();
        let all = TYPES.get_or_init(|| Query::ALL.iter().map(|q| cast_types(q.sql())).collect());
        all.get(self as usize).map_or(&[], Vec::as_slice)
    }

    /// `params` paired with [`Query::param_types`], as `query_typed`
    /// takes them.
    pub(super) fn typed<'a>(
        self,
        params: &[&'a (dyn ToSql + Sync)],
    ) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
        let types = self.param_types().iter().cloned();
        params.iter().copied().zip(types).collect()
    }

    /// Whether the statement is sent unprepared even on a connection that
    /// prepares, so that the server plans it for each call's arguments: a
    /// prepared statement's generic plan would not know the queue and
    /// state, and may walk a whole queue for a page of its rare rows.
    pub(super) fn planned_per_call(self) -> bool {
        matches!(
            self,
            Query::Jobs | Query::DeadLetters | Query::JobSummaries | Query::DeadLetterSummaries
        )
    }

    /// The statement's SQL.
    pub(super) fn sql(self) -> &'static str {
        use Query as S;
        match self {
            S::Enqueue => concat!(
                "SELECT lease.enqueue(queue => $1::text, payload => $2::jsonb, key => $3::text, run_at => ",
                at_or_null!("4"),
                ", priority => $5::int, unique_key => $6::text, concurrency_key => $7::text, ",
                "fairness_key => $8::text)"
            ),
            S::EnqueueBatch => concat!(
                "SELECT e.id FROM lease.enqueue_batch(queue => $1::text, payloads => $2::jsonb[], ",
                "keys => $3::text[], run_at => ",
                at_or_null!("4"),
                ", priority => $5::int, concurrency_keys => $6::text[], fairness_keys => $7::text[]) ",
                "AS e(id)"
            ),
            S::Claim => concat!(
                "SELECT c.id, c.queue, c.key, c.payload, c.epoch, c.attempt, c.lease_until, c.eligible_at ",
                "FROM lease.claim_pending(\"limit\" => $1::int, ttl => ",
                micros!("2"),
                ", owner => $3::text, queue => $4::text) AS c"
            ),
            S::Reclaim => concat!(
                "SELECT c.id, c.queue, c.key, c.payload, c.epoch, c.attempt, c.lease_until, c.eligible_at ",
                "FROM lease.reclaim_own(\"limit\" => $1::int, ttl => ",
                micros!("2"),
                ", owner => $3::text, queue => $4::text) AS c"
            ),
            S::Renew => concat!(
                "SELECT r.id, r.held, r.lease_until, r.cancel_requested ",
                "FROM lease.renew(id => $1::bigint, owner => $2::text, epoch => $3::bigint, ttl => ",
                micros!("4"),
                ", queue => $5::text) AS r"
            ),
            S::RenewBatch => concat!(
                "SELECT r.id, r.held, r.lease_until, r.cancel_requested ",
                "FROM lease.renew_batch(ids => $1::bigint[], owner => $2::text, epochs => $3::bigint[], ttl => ",
                micros!("4"),
                ", queue => $5::text) AS r"
            ),
            S::Release => concat!(
                "SELECT lease.release(id => $1::bigint, owner => $2::text, epoch => $3::bigint, ",
                "outcome => $4::text, retry_at => ",
                at_or_null!("5"),
                ", error => $6::text, queue => $7::text)"
            ),
            S::ReleaseBatch => concat!(
                "SELECT r.id, r.released FROM lease.release_batch(ids => $1::bigint[], owner => $2::text, ",
                "epochs => $3::bigint[], outcome => $4::text, retry_at => ",
                at_or_null!("5"),
                ", error => $6::text, queue => $7::text) AS r"
            ),
            S::ReleaseAndClaim => concat!(
                "SELECT r.released, r.id, $6::text, r.key, r.payload, r.epoch, r.attempt, r.lease_until, r.eligible_at ",
                "FROM lease.release_and_claim(ids => $1::bigint[], owner => $2::text, epochs => $3::bigint[], ",
                "\"limit\" => $4::int, ttl => ",
                micros!("5"),
                ", queue => $6::text) AS r"
            ),
            S::FencedUpdate => {
                "SELECT lease.fenced_update(id => $1::bigint, epoch => $2::bigint, patch => $3::jsonb, queue => $4::text)"
            }
            // The queue named by an expression: a distributed install then runs
            // the call on its coordinator, where the row is found (a NULL
            // constant there is refused; Citus forwards constants only).
            S::Cancel => "SELECT lease.cancel(id => $1::bigint, queue => lease.queue_of($1::bigint))",
            S::TryAcquire => concat!(
                "SELECT lease.try_acquire(name => $1::text, owner => $2::text, ttl => ",
                micros!("3"),
                ")"
            ),
            S::RenewNamed => concat!(
                "SELECT lease.renew_named(name => $1::text, owner => $2::text, epoch => $3::bigint, ttl => ",
                micros!("4"),
                ")"
            ),
            S::ReleaseNamed => {
                "SELECT lease.release_named(name => $1::text, owner => $2::text, epoch => $3::bigint)"
            }
            S::CreateQueue => concat!(
                "SELECT lease.create_queue(name => $1::text, max_attempts => $2::int, backoff_base => ",
                micros!("3"),
                ", backoff_max => ",
                micros!("4"),
                ", retention => ",
                micros!("5"),
                ", dead_retention => ",
                micros!("6"),
                ", jitter => $7::text, concurrency => $8::int, max_payload_bytes => $9::int, ",
                "rate_limit => $10::int, rate_period => ",
                micros!("11"),
                ")"
            ),
            S::DropQueue => "SELECT lease.drop_queue(name => $1::text, force => $2::boolean)",
            S::Reap => concat!(
                "SELECT r.queue, r.requeued, r.dead, r.cancelled ",
                "FROM lease.reap(max_rows => $1::int) AS r"
            ),
            S::Purge => "SELECT lease.purge(max_rows => $1::int)",
            S::QueueStats => concat!(
                "SELECT queue, pending, ready, leased, expired, done, dead, cancelled, ",
                as_micros!("oldest_ready_age"),
                ", recovered_total, paused FROM lease.read_queue_stats() ORDER BY queue"
            ),
            S::Metrics => concat!(
                "SELECT queue, ready, delayed, leased, expired, dead, ",
                as_micros!("oldest_ready_age"),
                ", ",
                as_micros!("reap_lag"),
                ", enqueued_total, claimed_total, done_total, retried_total, dead_total, ",
                "cancelled_total, recovered_total, held, paused, rate_limit, ",
                as_micros!("rate_period"),
                ", rate_used FROM lease.read_metrics() ORDER BY queue"
            ),
            S::FairnessKeys => concat!(
                "SELECT queue, fairness_key, weight, pending, ready, leased, rate_limit, ",
                as_micros!("rate_period"),
                ", claimed_in_period, held_until FROM lease.read_fairness_keys($1::text) ",
                "ORDER BY queue, fairness_key"
            ),
            S::InFlight => concat!(
                "SELECT id, queue, key, owner, epoch, attempt, lease_until, ",
                as_micros!("remaining"),
                ", cancel_requested FROM lease.read_in_flight($1::text) ORDER BY id"
            ),
            S::Holders => concat!(
                "SELECT name, owner, epoch, acquired_at, lease_until, ",
                as_micros!("remaining"),
                " FROM lease.holders ORDER BY name"
            ),
            S::CancelKey => "SELECT lease.cancel_key(queue => $1::text, key => $2::text)",
            S::Requeue => "SELECT lease.requeue(id => $1::bigint)",
            S::ReleaseNamedBatch => concat!(
                "SELECT name, released FROM lease.release_named_batch(names => $1::text[], owner => $2::text, ",
                "epochs => $3::bigint[])"
            ),
            S::Grant => concat!(
                "SELECT lease.grant(queue => $1::text, role => $2::text::regrole, ",
                "work => $3::boolean, produce => $4::boolean)"
            ),
            S::Revoke => "SELECT lease.revoke(queue => $1::text, role => $2::text::regrole)",
            S::DeadLetters => concat!(
                "SELECT id, queue, key, payload, attempt, last_error, finished_at ",
                "FROM lease.read_dead_letters($1::text, $2::bigint) ORDER BY id"
            ),
            S::ReaperStats => concat!(
                "SELECT database::text, sweeps, recovered, purged, last_sweep_at, ",
                as_micros!("last_duration"),
                ", last_error, last_error_at, slot_shortages, last_slot_shortage_at ",
                "FROM lease.reaper_stats"
            ),
            S::QueueSettings => concat!(
                "SELECT name, max_attempts, ",
                as_micros!("backoff_base"),
                ", ",
                as_micros!("backoff_max"),
                ", ",
                as_micros!("retention"),
                ", ",
                as_micros!("dead_retention"),
                ", jitter = 'full', restricted, attached, created_at, rate_limit, ",
                as_micros!("rate_period"),
                " FROM lease.queue ORDER BY name"
            ),
            S::Jobs => jobs_in_states!(job_columns),
            S::JobByKey => concat!(job_columns!(), "WHERE queue = $1::text AND key = $2::text"),
            S::Job => concat!(job_columns!(), "WHERE id = $1::bigint"),
            S::ExtensionVersions => concat!(
                "SELECT current_database()::text, ",
                "(SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_lease'), ",
                "(SELECT default_version FROM pg_catalog.pg_available_extensions WHERE name = 'pg_lease')"
            ),
            S::Schedule => concat!(
                "SELECT lease.schedule(name => $1::text, queue => $2::text, cron => $3::text, every => ",
                micros!("4"),
                ", payload => $5::jsonb, priority => $6::int, missed => $7::text)"
            ),
            // One statement: if the fence fails, the sweep's work is rolled
            // back with it; if it holds, its lock keeps the lease from a new
            // holder until the sweep commits.
            S::SweepFenced => concat!(
                "SELECT s.recovered, s.purged ",
                "FROM lease.fence_named(name => $1::text, epoch => $2::bigint) AS f, ",
                "lease.sweep(max_rows => $3::int) AS s"
            ),
            S::Unschedule => "SELECT lease.unschedule(name => $1::text)",
            S::ApplyWriteBacks => "SELECT lease.apply_write_backs(max_rows => $1::int)",
            S::Pause => "SELECT lease.pause(queue => $1::text)",
            // The call alone, its interval read by `rows::Interval`: a
            // distributed install forwards it to the queue's node only so
            // (inside an expression it runs on the coordinator).
            S::RateWait => "SELECT lease.rate_wait(queue => $1::text)",
            S::Resume => "SELECT lease.resume(queue => $1::text)",
            S::SetWeight => concat!(
                "SELECT lease.set_weight(queue => $1::text, fairness_key => $2::text, ",
                "weight => $3::int)"
            ),
            S::WaitReason => "SELECT lease.wait_reason(id => $1::bigint)",
            S::SetKeyRate => concat!(
                "SELECT lease.set_key_rate(queue => $1::text, fairness_key => $2::text, ",
                "rate_limit => $3::int, rate_period => $4::bigint * interval '1 microsecond')"
            ),
            S::PurgeDead => "SELECT lease.purge_dead(queue => $1::text)",
            S::JobSummaries => jobs_in_states!(job_summary_columns),
            S::JobSummaryByKey => concat!(
                job_summary_columns!(),
                "WHERE queue = $1::text AND key = $2::text"
            ),
            // OFFSET 0 keeps the subquery from being pulled up, so the
            // server prints the payload once for both columns.
            S::JobPreview => concat!(
                job_summary_select!(),
                ", left(p.t, $2::int), octet_length(p.t)::bigint ",
                "FROM lease.job, LATERAL (SELECT payload::text AS t OFFSET 0) p ",
                "WHERE id = $1::bigint"
            ),
            S::DeadLetterSummaries => concat!(
                "SELECT id, queue, key, attempt, ",
                cut_error!(),
                ", finished_at FROM lease.dead_letters WHERE $1::text IS NULL OR queue = $1::text ",
                "ORDER BY id LIMIT $2::bigint"
            ),
            S::Schedules => concat!(
                "SELECT name, queue, cron, ",
                as_micros!("every"),
                ", next_at, enqueued, last_run_at, last_error FROM lease.schedule ORDER BY name"
            ),
        }
    }
}

/// Parameter types from the casts on `$n` in `sql`, indexed by `n - 1`;
/// [`Type::UNKNOWN`] for a parameter without a cast this knows (the unit
/// test below rules that out for every statement).
fn cast_types(sql: &str) -> Vec<Type> {
    let mut types = Vec::new();
    for (at, _) in sql.match_indices('$') {
        let rest = &sql[at + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(n) = rest[..digits].parse::<usize>() else {
            continue;
        };
        let cast = rest[digits..].strip_prefix("::").map(|t| {
            let name = t
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                .count();
            let array = t[name..].starts_with("[]");
            type_named(&t[..name], array)
        });
        if types.len() < n {
            types.resize(n, Type::UNKNOWN);
        }
        if let Some(ty) = cast {
            types[n - 1] = ty;
        }
    }
    types
}

/// The types the statements cast their parameters to.
fn type_named(name: &str, array: bool) -> Type {
    match (name, array) {
        ("text", false) => Type::TEXT,
        ("text", true) => Type::TEXT_ARRAY,
        ("bigint", false) => Type::INT8,
        ("bigint", true) => Type::INT8_ARRAY,
        ("int", false) => Type::INT4,
        ("int", true) => Type::INT4_ARRAY,
        ("boolean", false) => Type::BOOL,
        ("jsonb", false) => Type::JSONB,
        ("jsonb", true) => Type::JSONB_ARRAY,
        _ => Type::UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The listings leave payloads in the database, and the preview reads
    /// the payload only as the text it cuts and measures.
    #[test]
    fn summaries_select_no_payload() {
        for q in [
            Query::JobSummaries,
            Query::JobSummaryByKey,
            Query::DeadLetterSummaries,
        ] {
            assert!(!q.sql().contains("payload"), "{q:?}: {}", q.sql());
        }
        let preview = Query::JobPreview.sql();
        assert_eq!(preview.matches("payload").count(), 1, "{preview}");
        assert!(preview.contains("payload::text AS t"), "{preview}");
    }

    /// Sending unprepared depends on it: every parameter of every statement
    /// has a cast to a type that `type_named` knows.
    #[test]
    fn every_parameter_has_a_known_cast() {
        for q in Query::ALL {
            assert_eq!(Query::ALL[*q as usize], *q);
            let types = q.param_types();
            assert!(
                types.iter().all(|t| *t != Type::UNKNOWN),
                "{q:?}: a parameter without a known cast: {types:?}"
            );
        }
        assert_eq!(
            Query::Enqueue.param_types(),
            [
                Type::TEXT,
                Type::JSONB,
                Type::TEXT,
                Type::INT8,
                Type::INT4,
                Type::TEXT,
                Type::TEXT,
                Type::TEXT
            ]
        );
    }
}
