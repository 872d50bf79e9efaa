//! Who holds (or waits for) the lease: written by the process itself, read by everyone else.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderRecord {
    pub pid: u32,
    pub program: String,
    pub purpose: String,
    /// When it took the lease (a holder) or its ticket (a waiter): milliseconds since the Unix
    /// epoch, wall clock, because other processes compute the age.
    pub since_unix_ms: u64,
    pub ticket: u64,
}

impl HolderRecord {
    /// How long ago `since` was.
    pub fn age(&self) -> Duration {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Duration::from_millis(now.saturating_sub(self.since_unix_ms))
    }

    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a record always serialises") + "\n"
    }

    pub(crate) fn from_json(text: &str) -> Option<HolderRecord> {
        serde_json::from_str(text).ok()
    }

    /// A waiter whose record cannot be read (being written, or damaged).
    pub(crate) fn unknown(ticket: u64) -> HolderRecord {
        HolderRecord {
            pid: 0,
            program: "?".into(),
            purpose: "?".into(),
            since_unix_ms: 0,
            ticket,
        }
    }
}

impl fmt::Display for HolderRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} ({}", self.pid, self.program)?;
        if !self.purpose.is_empty() {
            write!(f, ", purpose {:?}", self.purpose)?;
        }
        write!(f, ")")
    }
}
