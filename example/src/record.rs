//! The reconcile record: one JSON line per reconcile start and end, and per write of a child,
//! appended to a file, for proving single ownership from the outside.
//!
//! A line is `{"t": <unix nanoseconds>, "shard": "...", "object": "ns/name", "event": "start",
//! "rv": "<the owner's resourceVersion as reconciled>"}`, `"end"` (written when the reconcile
//! returns or is abandoned, its future dropped, e.g. when the Lease is lost; a killed process
//! leaves its last starts open), or `"write"` with `"child": "ns/name"` (the child the reconcile
//! created or updated). Every line names the run of the shard that wrote it (`"incarnation"`).

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
    /// The reconcile created or updated a child.
    Write,
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
    /// Start, end or write.
    pub event: Event,
    /// The owner's resourceVersion as the shard saw it (start and write lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rv: Option<String>,
    /// The child written (write lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// Which run of the shard wrote the line (`<pid>-<start nanoseconds>`): a restarted shard
    /// keeps its name, and only this tells it from its predecessor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
}

/// Appends lines to the record file.
#[derive(Clone)]
pub struct Recorder {
    file: Arc<Mutex<File>>,
    shard: String,
    incarnation: String,
}

/// An open reconcile; its end is written when dropped.
pub struct Open {
    recorder: Recorder,
    object: String,
    rv: Option<String>,
}

impl Open {
    /// Records that this reconcile created or updated `child`.
    pub fn wrote(&self, child: &str) {
        self.recorder
            .write(&self.object, Event::Write, self.rv.as_deref(), Some(child));
    }
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
            incarnation: format!("{}-{}", std::process::id(), now()),
        })
    }

    fn write(&self, object: &str, event: Event, rv: Option<&str>, child: Option<&str>) {
        let line = Line {
            t: now(),
            shard: self.shard.clone(),
            object: object.to_owned(),
            event,
            rv: rv.map(str::to_owned),
            child: child.map(str::to_owned),
            incarnation: Some(self.incarnation.clone()),
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

    /// Records the start of a reconcile of `object` at resourceVersion `rv`; the end is
    /// recorded when the result drops.
    pub fn reconcile(&self, object: &str, rv: Option<&str>) -> Open {
        self.write(object, Event::Start, rv, None);
        Open {
            recorder: self.clone(),
            object: object.to_owned(),
            rv: rv.map(str::to_owned),
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.recorder.write(&self.object, Event::End, None, None);
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
            let open = recorder.reconcile("ns/a", Some("42"));
            open.wrote("ns/checksums-a");
        }
        let lines = parse(&std::fs::read_to_string(&dir).expect("read"));
        let _ = std::fs::remove_file(&dir);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].event, Event::Start);
        assert_eq!(lines[0].rv.as_deref(), Some("42"));
        assert_eq!(lines[1].event, Event::Write);
        assert_eq!(
            (lines[1].rv.as_deref(), lines[1].child.as_deref()),
            (Some("42"), Some("ns/checksums-a"))
        );
        assert_eq!(lines[2].event, Event::End);
        assert!(lines[0].t <= lines[1].t && lines[1].t <= lines[2].t);
        assert!(
            lines
                .iter()
                .all(|l| l.shard == "shard-0" && l.object == "ns/a")
        );
        assert!(lines[0].incarnation.is_some());
        assert!(lines.iter().all(|l| l.incarnation == lines[0].incarnation));
    }

    #[test]
    fn a_second_run_of_a_shard_is_told_from_the_first() {
        let path = std::env::temp_dir().join(format!("record-runs-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        for _ in 0..2 {
            let recorder = Recorder::open(&path, "shard-0").expect("open");
            drop(recorder.reconcile("ns/a", None));
        }
        let lines = parse(&std::fs::read_to_string(&path).expect("read"));
        let _ = std::fs::remove_file(&path);
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0].incarnation, lines[1].incarnation);
        assert_ne!(lines[1].incarnation, lines[2].incarnation);
    }

    #[test]
    fn a_torn_line_is_skipped() {
        let text = "{\"t\":1,\"shard\":\"s\",\"object\":\"o\",\"event\":\"start\"}\n{\"t\":2,\"sha";
        assert_eq!(parse(text).len(), 1);
    }
}
