//! The reconcile record: one JSON line per reconcile start and end, appended to a file, for
//! proving single ownership from the outside.
//!
//! A line is `{"t": <unix nanoseconds>, "shard": "...", "object": "ns/name", "event": "start"}`
//! (or `"end"`). An end is written when the reconcile returns or is abandoned (its future
//! dropped, e.g. when the Lease is lost); a killed process leaves its last starts open.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Whether a line marks the start or the end of a reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Event {
    /// The reconcile began.
    Start,
    /// The reconcile returned or was abandoned.
    End,
}

/// One line of the record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// Wall-clock time in nanoseconds since the Unix epoch.
    pub t: u128,
    /// The shard.
    pub shard: String,
    /// `namespace/name` of the reconciled object.
    pub object: String,
    /// Start or end.
    pub event: Event,
}

/// Appends lines to the record file.
#[derive(Clone)]
pub struct Recorder {
    file: Arc<Mutex<File>>,
    shard: String,
}

/// An open reconcile; its end is written when dropped.
pub struct Open {
    recorder: Recorder,
    object: String,
}

fn now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

impl Recorder {
    /// Opens (appends to, creating) `path` for the shard `shard`.
    pub fn open(path: &Path, shard: &str) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            file: Arc::new(Mutex::new(file)),
            shard: shard.to_owned(),
        })
    }

    fn write(&self, object: &str, event: Event) {
        let line = Line {
            t: now(),
            shard: self.shard.clone(),
            object: object.to_owned(),
            event,
        };
        let Ok(mut text) = serde_json::to_string(&line) else {
            return;
        };
        text.push('\n');
        if let Ok(mut file) = self.file.lock() {
            // One write per line on an O_APPEND file: lines of concurrent writers never interleave.
            let _ = file.write_all(text.as_bytes());
        }
    }

    /// Records the start of a reconcile of `object`; the end is recorded when the result drops.
    pub fn reconcile(&self, object: &str) -> Open {
        self.write(object, Event::Start);
        Open {
            recorder: self.clone(),
            object: object.to_owned(),
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.recorder.write(&self.object, Event::End);
    }
}

/// Parses a record file's text; unparsable lines (a torn last line of a killed process) are
/// skipped.
pub fn parse(text: &str) -> Vec<Line> {
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reconcile_writes_a_start_and_an_end_line() {
        let dir = std::env::temp_dir().join(format!("record-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let recorder = Recorder::open(&dir, "shard-0").expect("open");
        {
            let _open = recorder.reconcile("ns/a");
        }
        let lines = parse(&std::fs::read_to_string(&dir).expect("read"));
        let _ = std::fs::remove_file(&dir);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].event, Event::Start);
        assert_eq!(lines[1].event, Event::End);
        assert!(lines[0].t <= lines[1].t);
        assert!(
            lines
                .iter()
                .all(|l| l.shard == "shard-0" && l.object == "ns/a")
        );
    }

    #[test]
    fn a_torn_line_is_skipped() {
        let text = "{\"t\":1,\"shard\":\"s\",\"object\":\"o\",\"event\":\"start\"}\n{\"t\":2,\"sha";
        assert_eq!(parse(text).len(), 1);
    }
}
