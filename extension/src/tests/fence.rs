//! Fenced writes (`sql/fence.sql`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

    #[pg_test]
    fn fenced_update_applies_only_under_the_current_epoch() {
        run("SELECT lease.enqueue('default', '{\"a\": 1, \"b\": 1}')");
        let (id, epoch) = claim_one("w", "1 minute", "default");
        assert!(check(&format!(
            "SELECT lease.fenced_update({id}, {epoch}, '{{\"b\": 2}}')"
        )));
        assert!(!check(&format!(
            "SELECT lease.fenced_update({id}, {}, '{{\"b\": 3}}')",
            epoch - 1
        )));
        assert!(check(&format!(
            "SELECT payload = '{{\"a\": 1, \"b\": 2}}' FROM lease.job WHERE id = {id}"
        )));
        assert_eq!(
            sqlstate(&format!("SELECT lease.fenced_update({id}, {epoch}, '[1]')")),
            "22023"
        );
        assert_eq!(
            sqlstate(&format!("SELECT lease.fenced_update({id}, {epoch}, NULL)")),
            "22004"
        );
    }

    #[pg_test]
    fn fence_guards_the_callers_own_writes() {
        run("SELECT lease.enqueue('default', '{}')");
        let (id, epoch) = claim_one("w", "1 minute", "default");
        assert!(check(&format!(
            "SELECT lease.fence({id}, {epoch}) > clock_timestamp() + interval '50 seconds'"
        )));
        assert_eq!(
            sqlstate(&format!("SELECT lease.fence({id}, {})", epoch + 1)),
            "LE001"
        );
        assert_eq!(
            sqlstate(&format!("SELECT lease.fence({id}, NULL)")),
            "22004"
        );
        assert!(check(&format!("SELECT lease.release({id}, 'w', {epoch})")));
        assert_eq!(
            sqlstate(&format!("SELECT lease.fence({id}, {epoch})")),
            "LE001"
        );
    }
}
