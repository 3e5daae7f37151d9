//! The catalog of schema `lease` as a set of lines, one per fact, so that
//! two installs can be compared object by object: an upgraded one with a
//! fresh one (`tests/upgrade.rs`), one without the library with the
//! extension (`tests/sql_install.rs`).

use std::collections::BTreeSet;

use tokio_postgres::Client;

/// One line per catalog fact of schema `lease` and of what the extension
/// owns: functions (definition, security, settings, privileges, comment),
/// tables and views (columns, constraints, indexes, triggers, privileges,
/// comments), types, event triggers, and the tables pg_dump keeps.
pub const CATALOG: &str = r#"
WITH ns AS (SELECT 'lease'::regnamespace AS oid)
SELECT 'function ' || p.oid::regprocedure || ': ' || pg_get_functiondef(p.oid)
       || ' acl=' || coalesce(p.proacl::text, '-')
       || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
  FROM pg_proc p, ns WHERE p.pronamespace = ns.oid
UNION ALL
SELECT 'relation ' || c.relname || ' kind=' || c.relkind::text || ' acl=' || coalesce(c.relacl::text, '-')
       || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '-')
       || CASE WHEN c.relkind = 'v' THEN ' view=' || pg_get_viewdef(c.oid) ELSE '' END
  FROM pg_class c, ns WHERE c.relnamespace = ns.oid
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
       || coalesce(' identity ' || nullif(a.attidentity::text, ''), '')
  FROM pg_class c JOIN ns ON c.relnamespace = ns.oid
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
UNION ALL
SELECT 'constraint ' || r.conrelid::regclass || ' ' || r.conname || ': ' || pg_get_constraintdef(r.oid)
  FROM pg_constraint r, ns WHERE r.connamespace = ns.oid
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN ns ON c.relnamespace = ns.oid
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN ns ON c.relnamespace = ns.oid
 WHERE NOT t.tgisinternal
UNION ALL
SELECT 'type ' || t.typname || ' ' || t.typtype::text || ' comment=' || coalesce(obj_description(t.oid, 'pg_type'), '-')
       || coalesce(' labels=' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                    FROM pg_enum e WHERE e.enumtypid = t.oid), '')
  FROM pg_type t, ns WHERE t.typnamespace = ns.oid AND t.typtype IN ('e', 'c')
   AND NOT EXISTS (SELECT FROM pg_class c WHERE c.reltype = t.oid AND c.relkind <> 'c')
UNION ALL
SELECT 'event trigger ' || e.evtname || ' ' || e.evtevent || ' ' || e.evtfoid::regproc
       || coalesce(' ' || e.evttags::text, '')
  FROM pg_event_trigger e
UNION ALL
SELECT 'dumped ' || c::regclass || coalesce(' ' || nullif(x.extcondition[i], ''), '')
  FROM pg_extension x, unnest(x.extconfig) WITH ORDINALITY AS u(c, i)
 WHERE x.extname = 'pg_lease'
UNION ALL
SELECT 'schema acl=' || coalesce(n.nspacl::text, '-') FROM pg_namespace n, ns WHERE n.oid = ns.oid
"#;

/// The lines of [`CATALOG`] in `client`'s database.
pub async fn catalog(client: &Client) -> BTreeSet<String> {
    client
        .query(CATALOG, &[])
        .await
        .expect("catalog")
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect()
}
