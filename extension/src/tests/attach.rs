//! Attached tables (`sql/attach.sql`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

    /// The rows of `items` (text keys) whose status is 'todo', attached.
    fn attach_items() {
        run("CREATE TABLE items (k text PRIMARY KEY, status text NOT NULL)");
        run("INSERT INTO items VALUES ('a', 'todo'), ('b', 'todo'), ('c', 'other')");
        assert_eq!(
            text("SELECT lease.attach('items', pending => $$status = 'todo'$$)").as_deref(),
            Some("items")
        );
    }

    fn keys() -> String {
        text("SELECT string_agg(key || ':' || state, ',' ORDER BY key) FROM lease.job WHERE queue = 'items'")
            .unwrap_or_default()
    }

    #[pg_test]
    fn attached_rows_follow_the_predicate() {
        attach_items();
        assert_eq!(keys(), "a:pending,b:pending");
        run("INSERT INTO items VALUES ('d', 'todo'), ('e', 'other')");
        run("UPDATE items SET status = 'todo' WHERE k = 'c'");
        // Unrelated writes to matching rows change nothing.
        run("UPDATE items SET status = status");
        assert_eq!(keys(), "a:pending,b:pending,c:pending,d:pending");

        let (id, epoch) = claim_one("w", "1 minute", "items");
        let key = text(&format!("SELECT key FROM lease.job WHERE id = {id}")).expect("key");
        // The owner's fenced write that ends the predicate ends the lease.
        run(&format!(
            "UPDATE items SET status = 'done' WHERE k = '{key}' AND lease.fence({id}, {epoch}) IS NOT NULL"
        ));
        assert!(check(&format!(
            "SELECT NOT held FROM lease.renew({id}, 'w', {epoch}, '1 minute')"
        )));
        assert_eq!(
            sqlstate(&format!(
                "UPDATE items SET status = 'x' WHERE k = '{key}' AND lease.fence({id}, {epoch}) IS NOT NULL"
            )),
            "LE001"
        );
        // A changed primary key, a delete, a row matching again.
        run("UPDATE items SET k = 'z' WHERE k = 'd'");
        run("DELETE FROM items WHERE k = 'c'");
        run(&format!(
            "UPDATE items SET status = 'todo' WHERE k = '{key}'"
        ));
        assert_eq!(
            text("SELECT string_agg(key, ',' ORDER BY key) FROM lease.job WHERE queue = 'items'")
                .as_deref(),
            Some("a,b,z")
        );
        // The row matching again is new work: a new id, hence a new token.
        assert!(check(&format!(
            "SELECT id <> {id} FROM lease.job WHERE key = '{key}'"
        )));
    }

    #[pg_test]
    fn detach_removes_everything_attach_added() {
        attach_items();
        claim_one("w", "1 minute", "items");
        assert_eq!(int("SELECT lease.detach('items')"), 2);
        assert_eq!(
            int("SELECT count(*) FROM lease.job WHERE queue = 'items'"),
            0
        );
        assert_eq!(
            int("SELECT count(*) FROM lease.queue WHERE name = 'items'"),
            0
        );
        assert_eq!(int("SELECT count(*) FROM lease.attachment"), 0);
        assert_eq!(
            int("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'items'::regclass"),
            0
        );
        assert_eq!(int("SELECT count(*) FROM items"), 3);
        run("INSERT INTO items VALUES ('f', 'todo')");
        assert_eq!(int("SELECT count(*) FROM lease.job"), 0);
    }

    #[pg_test]
    fn attach_rejects_bad_input_and_changes_nothing() {
        run("CREATE TABLE two_keys (a int, b int, PRIMARY KEY (a, b))");
        run("CREATE TABLE no_key (a int)");
        run("CREATE TABLE numeric_key (a numeric PRIMARY KEY)");
        run("CREATE TABLE ok (id bigint PRIMARY KEY, s text)");
        for (sql, state) in [
            ("SELECT lease.attach('two_keys', 'true')", "0A000"),
            ("SELECT lease.attach('no_key', 'true')", "0A000"),
            ("SELECT lease.attach('numeric_key', 'true')", "0A000"),
            ("SELECT lease.attach('ok', 'nosuch = 1')", "42703"),
            (
                "SELECT lease.attach('ok', 's = ''x''; DROP TABLE ok')",
                "42601",
            ),
            ("SELECT lease.attach('ok', 's')", "42804"),
            ("SELECT lease.attach('ok', 'id IN (SELECT 1)')", "0A000"),
            ("SELECT lease.attach('ok', NULL)", "22004"),
            ("SELECT lease.attach(NULL, 'true')", "22004"),
            (
                "SELECT lease.attach('ok', 'true', queue => 'default')",
                "42710",
            ),
            (
                "SELECT lease.attach('ok', 'true', max_attempts => 0)",
                "22023",
            ),
            ("SELECT lease.detach('ok')", "42704"),
        ] {
            assert_eq!(sqlstate(sql), state, "{sql}");
        }
        assert_eq!(int("SELECT count(*) FROM lease.attachment"), 0);
        assert_eq!(
            int("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'ok'::regclass"),
            0
        );
        run("SELECT lease.attach('ok', 'true')");
        assert_eq!(sqlstate("SELECT lease.attach('ok', 'true')"), "42710");
        assert_eq!(sqlstate("SELECT lease.drop_queue('ok', true)"), "55006");
    }
}
