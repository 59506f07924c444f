//! The per-key order of the advisory lock form, checked by the bench: each handler's start and
//! end, by key, and whether a key's rows started in id order, one at a time.
//!
//! In one process the log sees every start of a key in the order it happened (under one
//! mutex) and keeps the rows of each key in work: a start while another row of its key is in
//! work, or a start of a row whose id is not above the last started row of its key, is an
//! error of the run. Across processes each child sends its spans (row id, start and end in
//! microseconds of the wall clock, which the processes of one machine share) and the parent
//! merges them by key and checks the same two rules by the times: sorted by start, the ids
//! rise, and each start is at or after the end of the row before it. A handler ends before its
//! row settles and its key is released, so a row of the same key that another process starts
//! after the release starts after that end.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::stats::now_us;

/// One row's handler: its id, and when it started and ended (microseconds since the Unix
/// epoch; `end_us` 0 while it is in work).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// The row's id.
    pub id: i64,
    /// When its handler started.
    pub start_us: i64,
    /// When its handler ended.
    pub end_us: i64,
}

#[derive(Default)]
struct Key {
    /// The rows of the key in work now.
    in_work: Vec<i64>,
    spans: Vec<Span>,
}

#[derive(Default)]
struct Inner {
    keys: BTreeMap<String, Key>,
    /// The first break of the rules seen in this process.
    error: Option<String>,
}

/// The handlers' starts and ends of one run in one process, by key.
#[derive(Default)]
pub(crate) struct Log {
    inner: Mutex<Inner>,
}

impl Log {
    /// The handler of row `id`, of `key`, starts.
    pub(crate) fn start(&self, key: &str, id: i64) {
        let now = now_us();
        let mut inner = self.inner.lock().expect("not poisoned");
        let entry = inner.keys.entry(key.to_owned()).or_default();
        let error = if let Some(&other) = entry.in_work.first() {
            Some(overlap(key, other, id))
        } else {
            entry
                .spans
                .last()
                .filter(|last| id <= last.id)
                .map(|last| out_of_order(key, last.id, id))
        };
        entry.in_work.push(id);
        entry.spans.push(Span {
            id,
            start_us: now,
            end_us: 0,
        });
        if inner.error.is_none() {
            inner.error = error;
        }
    }

    /// The handler of row `id`, of `key`, ends.
    pub(crate) fn end(&self, key: &str, id: i64) {
        let now = now_us();
        let mut inner = self.inner.lock().expect("not poisoned");
        if let Some(entry) = inner.keys.get_mut(key) {
            entry.in_work.retain(|&i| i != id);
            if let Some(span) = entry.spans.iter_mut().rev().find(|s| s.id == id) {
                span.end_us = now;
            }
        }
    }

    /// Whether any handler started.
    pub(crate) fn is_empty(&self) -> bool {
        self.inner.lock().expect("not poisoned").keys.is_empty()
    }

    /// The spans by key, and the first break of the rules this process saw.
    pub(crate) fn take(&self) -> (BTreeMap<String, Vec<Span>>, Option<String>) {
        let mut inner = self.inner.lock().expect("not poisoned");
        let keys = std::mem::take(&mut inner.keys)
            .into_iter()
            .map(|(key, k)| (key, k.spans))
            .collect();
        (keys, inner.error.take())
    }

    /// Adds the spans another process recorded, with the first break of the rules it saw.
    pub(crate) fn absorb(&self, spans: BTreeMap<String, Vec<Span>>, error: Option<String>) {
        let mut inner = self.inner.lock().expect("not poisoned");
        for (key, mut list) in spans {
            inner.keys.entry(key).or_default().spans.append(&mut list);
        }
        if inner.error.is_none() {
            inner.error = error;
        }
    }

    /// Checks the run: the first break of the rules a process saw, else the merged spans of
    /// every key by their times ([`check`]).
    pub(crate) fn verify(&self) -> Result<(), String> {
        let (spans, error) = self.take();
        match error {
            Some(error) => Err(error),
            None => check(spans),
        }
    }
}

fn overlap(key: &str, first: i64, second: i64) -> String {
    format!("key {key}: rows {first} and {second} were in work at once")
}

fn out_of_order(key: &str, before: i64, after: i64) -> String {
    format!("key {key}: row {after} started after row {before}, out of id order")
}

/// Checks the spans of each key, from one process or several: sorted by start (a stable sort,
/// so the rows of one process that started in the same microsecond keep their order), each
/// row's id is above the one before it and it starts at or after that one's end.
pub(crate) fn check(spans: BTreeMap<String, Vec<Span>>) -> Result<(), String> {
    for (key, mut list) in spans {
        list.sort_by_key(|s| s.start_us);
        for pair in list.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if a.end_us == 0 || b.start_us < a.end_us {
                return Err(overlap(&key, a.id, b.id));
            }
            if b.id <= a.id {
                return Err(out_of_order(&key, a.id, b.id));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: i64, start_us: i64, end_us: i64) -> Span {
        Span {
            id,
            start_us,
            end_us,
        }
    }

    fn one(key: &str, list: Vec<Span>) -> BTreeMap<String, Vec<Span>> {
        BTreeMap::from([(key.to_owned(), list)])
    }

    #[test]
    fn rows_of_a_key_one_after_another_in_id_order_pass() {
        let mut spans = one("bench-0", vec![span(1, 10, 20), span(6, 20, 30)]);
        spans.insert("bench-1".to_owned(), vec![span(2, 10, 40), span(7, 41, 50)]);
        assert_eq!(check(spans), Ok(()));
    }

    #[test]
    fn a_row_that_starts_before_an_earlier_row_of_its_key_is_caught() {
        // Row 6 started (and ended) before row 1 of the same key.
        let spans = one("bench-0", vec![span(1, 30, 40), span(6, 10, 20)]);
        assert_eq!(
            check(spans),
            Err("key bench-0: row 1 started after row 6, out of id order".to_owned())
        );
    }

    #[test]
    fn two_rows_of_a_key_in_work_at_once_are_caught() {
        // Row 6 started at 15, before row 1 ended at 20.
        let spans = one("bench-3", vec![span(1, 10, 20), span(6, 15, 30)]);
        assert_eq!(
            check(spans),
            Err("key bench-3: rows 1 and 6 were in work at once".to_owned())
        );
        // Still in work (no end) when the next started.
        let spans = one("bench-3", vec![span(1, 10, 0), span(6, 15, 30)]);
        assert!(check(spans).is_err());
    }

    #[test]
    fn spans_of_several_processes_are_merged_before_the_check() {
        let log = Log::default();
        log.absorb(
            one("bench-0", vec![span(1, 10, 20), span(11, 50, 60)]),
            None,
        );
        log.absorb(one("bench-0", vec![span(6, 30, 40)]), None);
        assert_eq!(log.verify(), Ok(()));
        let log = Log::default();
        log.absorb(one("bench-0", vec![span(1, 10, 20), span(6, 50, 60)]), None);
        log.absorb(one("bench-0", vec![span(11, 30, 40)]), None);
        assert_eq!(
            log.verify(),
            Err("key bench-0: row 6 started after row 11, out of id order".to_owned())
        );
    }

    #[test]
    fn the_log_of_one_process_catches_an_overlap_and_an_id_out_of_order() {
        let log = Log::default();
        log.start("bench-0", 1);
        log.start("bench-0", 6);
        log.end("bench-0", 1);
        log.end("bench-0", 6);
        assert_eq!(
            log.verify(),
            Err("key bench-0: rows 1 and 6 were in work at once".to_owned())
        );
        let log = Log::default();
        log.start("bench-0", 6);
        log.end("bench-0", 6);
        log.start("bench-0", 1);
        log.end("bench-0", 1);
        assert_eq!(
            log.verify(),
            Err("key bench-0: row 1 started after row 6, out of id order".to_owned())
        );
        let log = Log::default();
        for id in [1, 6, 11] {
            log.start("bench-0", id);
            log.end("bench-0", id);
        }
        assert_eq!(log.verify(), Ok(()));
    }
}
