//! CPU time of the server and of the client side of a measurement, read
//! from `/proc`: a coarse profile that says which side a drain is bound by.
//!
//! Server: the postmaster's children, live ones (`utime + stime`) plus
//! those already exited and reaped (the postmaster's `cutime + cstime`).
//! Client: this process and its reaped children (pgbench).

use std::path::Path;

/// Ticks per second of the times in `/proc/<pid>/stat` (`USER_HZ`, 100 on
/// every Linux this runs on).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds used so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    /// By the cluster's processes.
    pub server: f64,
    /// By this process and the children it has reaped.
    pub client: f64,
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;

    fn sub(self, earlier: Cpu) -> Cpu {
        Cpu {
            server: self.server - earlier.server,
            client: self.client - earlier.client,
        }
    }
}

/// `(ppid, utime + stime, cutime + cstime)` of a process, in ticks.
fn stat(pid: &str) -> Option<(u32, u64, u64)> {
    let text = std::fs::read_to_string(Path::new("/proc").join(pid).join("stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the
    // last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((u32::try_from(n(1)?).ok()?, n(11)? + n(12)?, n(13)? + n(14)?))
}

impl Cpu {
    /// A reading now, for the cluster whose postmaster is `postmaster`.
    pub fn now(postmaster: u32) -> Cpu {
        let mut server = stat(&postmaster.to_string()).map_or(0, |(_, own, reaped)| own + reaped);
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str() else { continue };
                if !pid.bytes().all(|b| b.is_ascii_digit()) {
                    continue;
                }
                if let Some((ppid, own, _)) = stat(pid) {
                    if ppid == postmaster {
                        server += own;
                    }
                }
            }
        }
        let client = stat("self").map_or(0, |(_, own, reaped)| own + reaped);
        Cpu {
            server: server as f64 / TICKS_PER_SECOND,
            client: client as f64 / TICKS_PER_SECOND,
        }
    }
}

/// The parent of process `pid` (a backend's: its postmaster).
pub fn parent_of(pid: u32) -> Result<u32, String> {
    stat(&pid.to_string())
        .map(|(ppid, _, _)| ppid)
        .ok_or_else(|| format!("no parent pid in /proc/{pid}/stat"))
}
