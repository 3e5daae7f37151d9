//! The sweeps the launcher runs at once: one per database, in up to
//! [`shared::SWEEP_SLOTS`] slots, so that a database whose sweep takes long
//! (a stuck session, a slow pass) delays none of the others.
//!
//! Each slot is a sweeper the launcher started and does not wait for, or,
//! when no worker slot was free, the [reserve](crate::reserve). A sweep
//! reports what it found into its slot ([`shared::report`]); the launcher
//! reads that back once it ended ([`Sweeps::finished`]), woken by the
//! postmaster (a sweeper's exit) or by the reserve.

use pgrx::bgworkers::{BackgroundWorkerStatus, DynamicBackgroundWorker};
use pgrx::prelude::*;

use crate::shared::{self, Findings, RESERVE_SLOT};
use crate::{reserve, sweeper, vacuum};

/// The sweeps running now.
#[derive(Default)]
pub struct Sweeps {
    running: Vec<Sweep>,
}

struct Sweep {
    oid: pg_sys::Oid,
    slot: usize,
    /// The sweeper; `None` when the reserve sweeps.
    worker: Option<DynamicBackgroundWorker>,
    /// Something asked for a look while it ran (a touch, a wake): the
    /// sweep may have started before that, so the database is looked at
    /// again once it ends.
    again: bool,
}

/// How a sweep of a database ended.
pub struct Ended {
    pub oid: pg_sys::Oid,
    pub findings: Findings,
    /// Whether it is to be looked at again at once ([`Sweeps::again`]).
    pub again: bool,
}

/// Why a sweep did not start.
#[derive(Debug, PartialEq, Eq)]
pub enum NotStarted {
    /// Every sweep slot is busy: it starts when one ends.
    Busy,
    /// No worker slot was free, nor the reserve.
    NoWorkerSlot,
}

impl Sweeps {
    /// Whether database `oid` is being swept.
    pub fn running(&self, oid: pg_sys::Oid) -> bool {
        self.running.iter().any(|s| s.oid == oid)
    }

    /// Asks for another look at `oid` once its running sweep ends.
    pub fn again(&mut self, oid: pg_sys::Oid) {
        for sweep in self.running.iter_mut().filter(|s| s.oid == oid) {
            sweep.again = true;
        }
    }

    /// Starts a sweep of `oid` in a free slot: a sweeper, or the reserve
    /// if no worker slot is free.
    pub fn start(
        &mut self,
        oid: pg_sys::Oid,
        name: &str,
        vacuumed: vacuum::Mark,
    ) -> Result<(), NotStarted> {
        let Some(slot) =
            (0..RESERVE_SLOT).find(|slot| self.running.iter().all(|s| s.slot != *slot))
        else {
            return Err(NotStarted::Busy);
        };
        shared::clear_findings(slot);
        if let Some(worker) = sweeper::start(oid, name, vacuumed, slot) {
            self.push(oid, slot, Some(worker));
            return Ok(());
        }
        // Every worker slot is taken (parallel query, say): the reserve's
        // is not.
        shared::count_slot_shortage();
        if !self.running.iter().any(|s| s.slot == RESERVE_SLOT) {
            shared::clear_findings(RESERVE_SLOT);
            if reserve::ask(oid, vacuumed) {
                self.push(oid, RESERVE_SLOT, None);
                return Ok(());
            }
        }
        if shared::warn_of_shortage() {
            warning!(
                "pg_lease: no free background worker slot to sweep database \"{name}\"; raise max_worker_processes"
            );
        }
        Err(NotStarted::NoWorkerSlot)
    }

    fn push(&mut self, oid: pg_sys::Oid, slot: usize, worker: Option<DynamicBackgroundWorker>) {
        self.running.push(Sweep {
            oid,
            slot,
            worker,
            again: false,
        });
    }

    /// The sweeps that ended since the last call, with what they found.
    pub fn finished(&mut self) -> Vec<Ended> {
        let (ended, running) = std::mem::take(&mut self.running)
            .into_iter()
            .partition::<Vec<_>, _>(Sweep::ended);
        self.running = running;
        ended
            .into_iter()
            .map(|s| Ended {
                oid: s.oid,
                findings: shared::take_findings(s.slot, s.oid),
                again: s.again,
            })
            .collect()
    }
}

impl Sweep {
    fn ended(&self) -> bool {
        match &self.worker {
            Some(worker) => matches!(
                worker.pid(),
                Err(BackgroundWorkerStatus::Stopped | BackgroundWorkerStatus::PostmasterDied)
            ),
            None => !reserve::busy(),
        }
    }
}
