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
