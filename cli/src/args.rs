//! The command line as clap reads it: global options, one variant per
//! command, and the exit codes `--help` prints.

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use pg_lease_client::JobState;

/// The exit-code contract, printed under `--help` and kept word for word in
/// docs/cli.md.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done: the answer was printed, or everything asked for happened
  1  the database refused (the message ends with its SQLSTATE), or something
     asked for did not happen (a row not dead, not found, already finished,
     no such queue, pg_lease not installed); stdout or stderr says which
  2  nothing was tried: bad arguments, no database configured, or the
     connection could not be opened (server unreachable, login refused,
     no such database)";

/// Inspect and operate pg_lease queues in one database.
#[derive(Parser, Debug)]
#[command(name = "pg-lease", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// Connection string (libpq style or postgresql:// URL); DATABASE_URL
    /// is used when neither this nor PG_LEASE_URL is set.
    // The value may hold a password: never show it in --help.
    #[arg(long, env = "PG_LEASE_URL", hide_env_values = true, global = true)]
    pub url: Option<String>,
    /// Machine-readable output: one JSON document per command (watch: one
    /// per refresh, one per line), keys in snake_case, times in RFC 3339
    /// UTC, durations in seconds (keys ending in _secs).
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Queues, reaper health and named-lease holders at a glance.
    Status,
    /// `status`, refreshed every --interval seconds until Ctrl-C.
    Watch {
        /// Seconds between refreshes (fractions allowed).
        #[arg(long, default_value = "2", value_parser = parse_interval)]
        interval: Duration,
        /// Stop after this many refreshes.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
    /// Every queue's policy and its rows by state.
    Queues,
    /// Rows per queue and state, oldest ready age, leases recovered.
    Stats,
    /// Rows of any state: `jobs list`, `jobs show ID` (superuser only).
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Leases held now (queue rows).
    InFlight {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// Fairness keys: weights, rows, rate limits, and which a full window holds back.
    Keys {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// Named leases and their holders.
    Holders,
    /// Dead letters, oldest first.
    Dead {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Puts dead letters back to pending, attempts reset (exit 1 if one was
    /// not dead); or, with --all --queue Q --yes, every dead letter of Q.
    Requeue {
        /// Row ids.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<i64>,
        /// Every dead letter of --queue (only with --yes; without it, says
        /// how many there are and changes nothing, exit 1).
        #[arg(long, requires = "queue")]
        all: bool,
        /// The queue of --all.
        #[arg(long, requires = "all")]
        queue: Option<String>,
        /// Confirms --all.
        #[arg(long, requires = "all")]
        yes: bool,
    },
    /// Schedules: when each fires next, rows enqueued, last error.
    Schedules,
    /// Stops claims of a queue (leases held run on; enqueues go on); exit
    /// 1 if it was paused already.
    Pause {
        /// The queue.
        queue: String,
    },
    /// Lets claims take a paused queue's rows again; exit 1 if it was not
    /// paused.
    Resume {
        /// The queue.
        queue: String,
    },
    /// Cancels a row by id, or by queue and key (exit 1 if it had finished
    /// or does not exist).
    Cancel {
        /// Row id.
        #[arg(conflicts_with_all = ["queue", "key"], required_unless_present = "key")]
        id: Option<i64>,
        /// Queue of the row to cancel by key.
        #[arg(long, requires = "key")]
        queue: Option<String>,
        /// Key of the row (an attached table's primary key as text).
        #[arg(long, requires = "queue")]
        key: Option<String>,
    },
    /// What the reaper does, now: recovers expired leases, then purges
    /// finished rows past their retention.
    #[command(visible_alias = "reap")]
    Sweep {
        /// At most this many rows each.
        #[arg(long, default_value_t = 1000)]
        max_rows: u32,
    },
    /// Deletes finished rows past their queue's retention now; or, with
    /// --dead --queue Q --yes, every dead letter of Q.
    Purge {
        /// At most this many.
        #[arg(long, default_value_t = 1000, conflicts_with = "dead")]
        max_rows: u32,
        /// Every dead letter of --queue, whatever its retention (only with
        /// --yes; without it, says how many there are, exit 1).
        #[arg(long, requires = "queue")]
        dead: bool,
        /// The queue of --dead.
        #[arg(long, requires = "dead")]
        queue: Option<String>,
        /// Confirms --dead.
        #[arg(long, requires = "dead")]
        yes: bool,
    },
    /// CREATE EXTENSION pg_lease in this database (superuser); nothing to
    /// do if it is there.
    Install,
    /// ALTER EXTENSION pg_lease UPDATE to the newest version the server's
    /// files offer; prints from-version → to-version.
    Upgrade,
    /// A web dashboard of this database, until Ctrl-C: queues, rows, dead
    /// letters, schedules, named leases, the reaper; with
    /// --allow-actions, requeue, cancel and purge as the connecting role.
    Ui {
        /// Address to listen on; anything but loopback is warned about.
        #[arg(long, default_value = "127.0.0.1:8420")]
        listen: std::net::SocketAddr,
        /// Offer requeue, cancel and purge (each as the connecting role's
        /// grants allow).
        #[arg(long)]
        allow_actions: bool,
        /// Also answer to this host name, as when a reverse proxy or an
        /// internal DNS name serves the dashboard (repeatable). IP
        /// addresses and localhost are always answered; other names are
        /// refused, against DNS rebinding.
        #[arg(long = "allow-host", value_name = "NAME", value_parser = crate::ui::host_name)]
        allow_hosts: Vec<String>,
        /// Answer only a browser logged in with the link printed at start
        /// (a cookie): closes the dashboard to the machine's other users,
        /// whom loopback does not keep out.
        #[arg(long)]
        login: bool,
    },
}

/// `pg-lease jobs ...`.
#[derive(Subcommand, Debug)]
pub enum JobsCommand {
    /// Rows, lowest id first.
    List {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only rows in this state.
        #[arg(long)]
        state: Option<StateArg>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Every column of one row, payload and last error included.
    Show {
        /// Row id.
        id: i64,
    },
}

/// A row state on the command line.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum StateArg {
    /// Waiting, claimable now or later.
    Pending,
    /// Under a lease.
    Leased,
    /// Finished (retained).
    Done,
    /// Dead letters.
    Dead,
    /// Cancelled (retained).
    Cancelled,
}

impl From<StateArg> for JobState {
    fn from(s: StateArg) -> JobState {
        match s {
            StateArg::Pending => JobState::Pending,
            StateArg::Leased => JobState::Leased,
            StateArg::Done => JobState::Done,
            StateArg::Dead => JobState::Dead,
            StateArg::Cancelled => JobState::Cancelled,
        }
    }
}

/// `--interval`: positive seconds, fractions allowed.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err("the interval must be more than 0 seconds".to_owned());
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definition_is_consistent_and_intervals_parse() {
        Cli::command().debug_assert();
        assert_eq!(parse_interval("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_interval("0.5"), Ok(Duration::from_millis(500)));
        for bad in ["0", "-1", "x", "NaN"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }
}
