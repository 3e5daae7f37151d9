//! What the test-only worker binaries (`src/bin/*`) share: they never
//! outlive the test that started them, and they run on a small runtime.

use std::io::Read;

/// Exits the process when its standard input closes: the test that
/// started it went away (or closed it on purpose).
pub fn exit_when_stdin_closes() {
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => std::process::exit(0),
                Ok(_) => {}
            }
        }
    });
}

/// Exits the process when its standard input closes or after `max`,
/// whichever comes first: a worker bounded in time as well.
pub fn exit_when_stdin_closes_or_after(max: std::time::Duration) {
    exit_when_stdin_closes();
    std::thread::spawn(move || {
        std::thread::sleep(max);
        std::process::exit(0);
    });
}

/// The process's `key=value` arguments, in order.
pub fn key_values() -> Result<Vec<(String, String)>, String> {
    std::env::args()
        .skip(1)
        .map(|arg| {
            arg.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("argument {arg:?} is not key=value"))
        })
        .collect()
}

/// The value of argument `key` as a number.
pub fn number(key: &str, value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .map_err(|e| format!("{key}={value}: {e}"))
}

/// A two-thread tokio runtime; exits with code 2, naming `program`, if
/// there is none to be had.
pub fn runtime(program: &str) -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("{program}: no tokio runtime: {err}");
            std::process::exit(2);
        }
    }
}
