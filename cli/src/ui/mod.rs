//! `pg-lease ui`: a web dashboard for operators, served by this process
//! from one database.
//!
//! Every page is a few calls of [`Client`], as the connecting role; every
//! action (`--allow-actions`) is one call of an existing SQL function, so
//! the role's grants decide what it may do and a refusal shows the
//! server's SQLSTATE. `pages` renders what is read (`job` one row and its
//! payload), `actions` what is changed, `guard` what every request passes
//! (host, login, CSRF, headers), `login` the `--login` cookie, `server`
//! the connections and their deadlines, `throughput` the samples behind
//! the charts, `views` the templates' data and `assets` the embedded CSS
//! and JavaScript.

mod actions;
mod assets;
mod guard;
mod job;
mod login;
mod pages;
mod reply;
mod server;
mod throughput;
mod views;

pub use guard::host_name;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use pg_lease_client::Client;

use crate::commands::Done;
use crate::error::CliError;

/// How `pg-lease ui` was started.
#[derive(Clone, Debug)]
pub struct Options {
    /// Address to listen on (port 0: any free port; the line printed at
    /// start says which).
    pub listen: SocketAddr,
    /// Whether pages offer requeue, cancel and purge.
    pub allow_actions: bool,
    /// Host names answered besides IP addresses and `localhost` (a reverse
    /// proxy's), lower case.
    pub allow_hosts: Vec<String>,
    /// Whether requests need the cookie of the login link printed at
    /// start.
    pub login: bool,
}

/// What every request handler shares.
struct Ui {
    client: Client,
    /// Whether POSTs may change anything.
    allow_actions: bool,
    /// The per-process token every form carries (see `guard`).
    csrf: String,
    /// `database at host:port`, for the header; never the password.
    database: String,
    /// Recent totals of every queue, for the throughput charts.
    throughput: throughput::Samples,
}

impl Ui {
    /// The frame of a page, `page` marked in the navigation.
    fn layout(&self, page: &'static str) -> views::Layout {
        views::Layout {
            page,
            database: self.database.clone(),
            actions: self.allow_actions,
            csrf: self.csrf.clone(),
        }
    }
}

/// Serves the dashboard until Ctrl-C.
pub async fn serve(client: Client, shown: String, options: Options) -> Result<Done, CliError> {
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|e| CliError::Listen(options.listen.to_string(), e))?;
    let bound = listener.local_addr().map_err(CliError::Serve)?;
    if !bound.ip().is_loopback() {
        eprintln!(
            "pg-lease ui: warning: listening on {bound}, not on loopback: anyone who reaches it \
             {}reads this database with the rights of the connecting role{}",
            if options.login {
                "with the login link "
            } else {
                ""
            },
            if options.allow_actions {
                ", and acts with them"
            } else {
                ""
            }
        );
    }
    let login = options
        .login
        .then(|| login::Login::new(bound.port()))
        .transpose()
        .map_err(CliError::Serve)?;
    let database = match client.extension_versions().await {
        Ok(v) => format!("{} at {shown}", v.database),
        Err(_) => shown,
    };
    let ui = Arc::new(Ui {
        client,
        allow_actions: options.allow_actions,
        csrf: guard::new_token().map_err(CliError::Serve)?,
        database,
        throughput: throughput::Samples::default(),
    });
    let sampler = tokio::spawn(throughput::sample(Arc::clone(&ui)));
    // The login link is printed here only: it is the secret.
    eprintln!(
        "pg-lease ui: serving http://{bound}/ (actions {}){}",
        if options.allow_actions { "on" } else { "off" },
        login.as_ref().map_or(String::new(), |l| format!(
            "; log in at {}",
            l.link(&format!("http://{bound}"))
        ))
    );
    let access = guard::Access {
        hosts: options.allow_hosts,
        login,
    };
    server::serve(listener, router(ui, Arc::new(access)), async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    sampler.abort();
    Ok(Done::All)
}

/// Every route, behind the guard that answers only to local names and the
/// `--allow-host` names, and with `--login` only to its cookie.
fn router(ui: Arc<Ui>, access: Arc<guard::Access>) -> Router {
    Router::new()
        .route("/", get(pages::queues))
        .route("/fragments/queues", get(pages::queues_fragment))
        .route("/queues/{name}", get(pages::queue))
        .route("/queue", get(pages::queue_by_query))
        .route("/jobs/{id}", get(job::job))
        .route("/jobs/{id}/payload", get(job::payload))
        .route("/dead", get(pages::dead))
        .route("/schedules", get(pages::schedules))
        .route("/leases", get(pages::leases))
        .route("/reaper", get(pages::reaper))
        .route("/assets/{file}", get(assets::asset))
        .route("/actions/requeue", post(actions::requeue))
        .route("/actions/cancel", post(actions::cancel))
        .route("/actions/cancel-key", post(actions::cancel_key))
        .route("/actions/purge-dead", post(actions::purge_dead))
        .route("/actions/pause", post(actions::pause))
        .route("/actions/resume", post(actions::resume))
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn(server::bounded_body))
        .layer(axum::middleware::from_fn_with_state(access, guard::check))
        .with_state(ui)
}
