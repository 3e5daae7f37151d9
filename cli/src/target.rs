//! Where to connect: the connection string of `--url` (or `PG_LEASE_URL`,
//! `DATABASE_URL`), completed as libpq completes one, from `PGHOST`,
//! `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD` and the password file
//! (`PGPASSFILE`, else `~/.pgpass`), so that `pg-lease` finds the database
//! every other Postgres tool finds.

use std::env;
use std::path::{Path, PathBuf};

use tokio_postgres::config::Host;
use tokio_postgres::Config;

use crate::error::CliError;

/// The variables that name a database on their own.
const LIBPQ_VARS: &[&str] = &["PGHOST", "PGPORT", "PGUSER", "PGDATABASE"];

/// Debian's libpq looks for the server's socket here when no host is given.
const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// A database to connect to, and how to name it in a message (host and
/// port, never the password).
pub struct Target {
    /// The complete configuration.
    pub config: Config,
    /// `host:port` of the first host, for messages.
    pub shown: String,
}

/// The target of `url` (the first of `--url`, `PG_LEASE_URL`,
/// `DATABASE_URL` that is set), completed from the libpq environment.
/// [`CliError::NoDatabase`] when neither names anything.
pub fn resolve(url: Option<String>) -> Result<Target, CliError> {
    resolve_with(url, &|name| env::var(name).ok().filter(|v| !v.is_empty()))
}

/// [`resolve`] with the environment as `var`, for tests.
fn resolve_with(
    url: Option<String>,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Target, CliError> {
    let url = url.filter(|u| !u.trim().is_empty());
    if url.is_none() && LIBPQ_VARS.iter().all(|v| var(v).is_none()) {
        return Err(CliError::NoDatabase);
    }
    let mut config: Config = match &url {
        Some(url) => url
            .parse()
            .map_err(|e: tokio_postgres::Error| CliError::BadConnectionString(describe(&e)))?,
        None => Config::new(),
    };
    if config.get_hosts().is_empty() {
        match var("PGHOST") {
            Some(hosts) => {
                for host in hosts.split(',') {
                    config.host(host);
                }
            }
            None if Path::new(DEFAULT_SOCKET_DIR).is_dir() => {
                config.host_path(DEFAULT_SOCKET_DIR);
            }
            None => {
                config.host("localhost");
            }
        }
    }
    if config.get_ports().is_empty() {
        let port = match var("PGPORT") {
            Some(p) => p.parse::<u16>().map_err(|_| {
                CliError::BadConnectionString(format!("PGPORT {p:?} is not a port number"))
            })?,
            None => 5432,
        };
        config.port(port);
    }
    if config.get_user().is_none() {
        if let Some(user) = var("PGUSER")
            .or_else(|| var("USER"))
            .or_else(|| var("LOGNAME"))
        {
            config.user(&user);
        }
    }
    if config.get_dbname().is_none() {
        if let Some(db) = var("PGDATABASE").or_else(|| config.get_user().map(str::to_owned)) {
            config.dbname(&db);
        }
    }
    let host = config
        .get_hosts()
        .first()
        .map(host_name)
        .unwrap_or_default();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    if config.get_password().is_none() {
        let password = var("PGPASSWORD").or_else(|| {
            let file = var("PGPASSFILE")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| Path::new(&h).join(".pgpass")))?;
            let text = std::fs::read_to_string(file).ok()?;
            let db = config.get_dbname().unwrap_or_default();
            let user = config.get_user().unwrap_or_default();
            password_for(&text, [&passfile_host(&host), &port.to_string(), db, user])
        });
        if let Some(password) = password {
            config.password(password);
        }
    }
    Ok(Target {
        shown: format!("{host}:{port}"),
        config,
    })
}

/// A host as a message shows it: a name, or a socket directory.
fn host_name(host: &Host) -> String {
    match host {
        Host::Tcp(name) => name.clone(),
        Host::Unix(path) => path.display().to_string(),
    }
}

/// libpq matches a socket directory as `localhost` in the password file.
fn passfile_host(host: &str) -> String {
    if host.starts_with('/') {
        "localhost".to_owned()
    } else {
        host.to_owned()
    }
}

/// The password of the first line of a password file whose host, port,
/// database and user fields match `wanted` (`*` matches anything; `\:` and
/// `\\` escape), as libpq reads it.
fn password_for(text: &str, wanted: [&str; 4]) -> Option<String> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            let fields = split_fields(line);
            let [host, port, db, user, password] = <[String; 5]>::try_from(fields).ok()?;
            let matches = [host, port, db, user]
                .iter()
                .zip(wanted)
                .all(|(field, want)| field == "*" || field == want);
            matches.then_some(password)
        })
        .next()
}

/// The colon-separated fields of a password-file line, unescaped.
fn split_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                let c = if c == '\\' {
                    chars.next().unwrap_or(c)
                } else {
                    c
                };
                if let Some(field) = fields.last_mut() {
                    field.push(c);
                }
            }
        }
    }
    fields
}

/// What is wrong with a connection string, in its parser's words.
fn describe(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn with(vars: &[(&str, &str)], url: Option<&str>) -> Result<Target, CliError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        resolve_with(url.map(str::to_owned), &|name| vars.get(name).cloned())
    }

    #[test]
    fn the_libpq_environment_completes_the_string() {
        let t = with(
            &[
                ("PGHOST", "db.internal"),
                ("PGPORT", "6432"),
                ("PGUSER", "ops"),
                ("PGDATABASE", "app"),
                ("PGPASSWORD", "secret"),
            ],
            None,
        )
        .expect("target");
        assert_eq!(t.shown, "db.internal:6432");
        assert_eq!(t.config.get_user(), Some("ops"));
        assert_eq!(t.config.get_dbname(), Some("app"));
        assert_eq!(t.config.get_password(), Some(&b"secret"[..]));
        // What the string gives wins; the rest comes from the environment.
        let t = with(
            &[("PGPORT", "6432"), ("PGUSER", "ops")],
            Some("host=h dbname=x"),
        )
        .expect("target");
        assert_eq!(t.shown, "h:6432");
        assert_eq!(
            (t.config.get_user(), t.config.get_dbname()),
            (Some("ops"), Some("x"))
        );
    }

    #[test]
    fn nothing_configured_and_bad_strings_are_named() {
        assert!(matches!(with(&[], None), Err(CliError::NoDatabase)));
        let Err(CliError::BadConnectionString(why)) = with(&[], Some("host=h port=notaport"))
        else {
            panic!("a bad port parsed");
        };
        assert!(why.contains("port"), "{why}");
        let Err(CliError::BadConnectionString(why)) =
            with(&[("PGPORT", "x"), ("PGHOST", "h")], None)
        else {
            panic!("a bad PGPORT parsed");
        };
        assert!(why.contains("PGPORT"), "{why}");
    }

    #[test]
    fn the_password_file_is_read_as_libpq_reads_it() {
        let file = "# comment\nother:5432:*:ops:no\nh:5432:app:ops:pa\\:ss\n*:*:*:*:any\n";
        assert_eq!(
            password_for(file, ["h", "5432", "app", "ops"]).as_deref(),
            Some("pa:ss")
        );
        assert_eq!(
            password_for(file, ["z", "1", "d", "u"]).as_deref(),
            Some("any")
        );
        assert_eq!(passfile_host("/var/run/postgresql"), "localhost");
    }
}
