//! lease's IMMUTABLE SQL functions are inlined by the planner.
//!
//! They exist to write a rule once (the state a lease's end moves its row
//! to, a backoff, an argument check) for statements that evaluate it per
//! row. PostgreSQL inlines such a function only if its body is no more
//! volatile than its declaration. Otherwise every statement that calls it
//! runs it through the SQL-function executor, which parses and plans the
//! body again per statement: ~210,000 instructions per call on PostgreSQL
//! 15, twice in every `release` that updates its row (docs/archive/
//! performance-history.md, "Completions").
//!
//! Failed before this change: `lease._next_state` cast its CASE of text
//! literals to `lease.job_state` as a whole, a run-time text-to-enum
//! conversion (`enum_in` is STABLE), so it was never inlined.

use pg_tests::Cluster;

#[tokio::test]
async fn every_immutable_sql_function_is_inlined() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let functions = pg
        .query(
            "SELECT p.proname::text,
                    (SELECT string_agg(format('$%s::%s', a.n, format_type(a.t, NULL)), ', ' ORDER BY a.n)
                       FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, n))
               FROM pg_proc p
              WHERE p.pronamespace = 'lease'::regnamespace
                AND p.prolang = (SELECT l.oid FROM pg_language l WHERE l.lanname = 'sql')
                AND p.provolatile = 'i'
              ORDER BY 1",
            &[],
        )
        .await
        .expect("lease's IMMUTABLE SQL functions");
    assert!(
        functions
            .iter()
            .any(|f| f.get::<_, String>(0) == "_next_state"),
        "lease._next_state is among them"
    );
    pg.batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
        .expect("generic plans: parameters stay parameters");
    let mut not_inlined = Vec::new();
    for function in &functions {
        let name: String = function.get(0);
        let args: Option<String> = function.get(1);
        let args = args.unwrap_or_default();
        let nulls = match args.matches('$').count() {
            0 => String::new(),
            n => format!("({})", vec!["NULL"; n].join(", ")),
        };
        pg.batch_execute(&format!("PREPARE call_it AS SELECT lease.{name}({args})"))
            .await
            .unwrap_or_else(|e| panic!("prepare a call of lease.{name}: {e}"));
        let plan: String = pg
            .query(&format!("EXPLAIN VERBOSE EXECUTE call_it{nulls}"), &[])
            .await
            .unwrap_or_else(|e| panic!("explain a call of lease.{name}: {e}"))
            .iter()
            .map(|row| row.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n");
        pg.batch_execute("DEALLOCATE call_it")
            .await
            .expect("deallocate");
        if plan.contains(&format!("{name}(")) {
            not_inlined.push(name);
        }
    }
    assert!(
        not_inlined.is_empty(),
        "IMMUTABLE SQL functions the planner does not inline: {not_inlined:?}"
    );
}
