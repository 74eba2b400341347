//! The checker's tests: hand-made histories, planted violations among them.

use super::*;
use crate::history::Written;

/// Builds a history of calls on one clock, in the order written.
#[derive(Default)]
struct H {
    events: Vec<Event>,
    next: u64,
}

const NF: i32 = -704;
const TRANSFER_FAIL: i32 = -800;
const CHECKSUM_MISMATCH: i32 = -801;
const RPC_TIMEOUT: i32 = -901;
/// A second, in the histories' nanoseconds.
const S: u64 = 1_000_000_000;

impl H {
    fn call(
        &mut self,
        client: &str,
        inv: u64,
        done: Option<u64>,
        op: Op,
        results: Vec<Outcome>,
    ) -> u64 {
        self.next += 1;
        let id = self.next;
        self.events.push(Event::Invoke {
            id,
            t: inv,
            client: client.into(),
            op,
        });
        if let Some(t) = done {
            self.events.push(Event::Complete { id, t, results });
        }
        id
    }
    fn put(&mut self, inv: u64, done: u64, key: &str, v: u64, r: Outcome) {
        let op = Op::Put {
            items: vec![Written {
                key: key.into(),
                version: v,
                len: 64,
            }],
        };
        self.call("w", inv, Some(done), op, vec![r]);
    }
    fn upsert(&mut self, inv: u64, done: Option<u64>, key: &str, v: u64, r: Outcome) {
        let op = Op::Upsert {
            items: vec![Written {
                key: key.into(),
                version: v,
                len: 64,
            }],
        };
        self.call("w", inv, done, op, vec![r]);
    }
    fn get(&mut self, inv: u64, done: u64, key: &str, r: Outcome) {
        let op = Op::Get {
            keys: vec![key.into()],
        };
        self.call("r", inv, Some(done), op, vec![r]);
    }
    fn remove(&mut self, inv: u64, done: Option<u64>, key: &str, r: Outcome) {
        let op = Op::Remove {
            keys: vec![key.into()],
            force: false,
        };
        self.call("w", inv, done, op, vec![r]);
    }
    /// Gets of `key` once a second from `from` through `to` seconds,
    /// failing with transfer and checksum errors by turns; how many.
    fn failing_gets(&mut self, from: u64, to: u64, key: &str) -> usize {
        for t in from..=to {
            let code = if t % 2 == 0 {
                TRANSFER_FAIL
            } else {
                CHECKSUM_MISMATCH
            };
            self.get(t * S, t * S + S / 10, key, err(code));
        }
        (to - from + 1) as usize
    }
    fn check(&self) -> Report {
        check(&self.events, CheckConfig::default())
    }
}

fn val(v: u64) -> Outcome {
    Outcome::Value { version: v }
}
fn err(code: i32) -> Outcome {
    Outcome::Err {
        code,
        msg: "m".into(),
    }
}

fn counts(r: &Report) -> [usize; 5] {
    Rule::ALL.map(|x| r.counts[x.name()])
}

#[test]
fn a_clean_history_has_no_violations() {
    let mut h = H::default();
    h.put(0, 10, "k", 1, Outcome::Ok);
    h.get(11, 12, "k", val(1));
    h.upsert(13, Some(20), "k", 2, Outcome::Ok);
    // Concurrent with the upsert: either value.
    h.get(14, 15, "k", val(1));
    h.get(16, 17, "k", val(2));
    h.get(21, 22, "k", val(2));
    // A write-once put of an existing key is a no-op success.
    h.put(23, 24, "k", 3, Outcome::Ok);
    h.get(25, 26, "k", val(2));
    h.remove(27, Some(28), "k", Outcome::Ok);
    h.get(29, 30, "k", err(NF));
    // Now absent: a put installs a new value.
    h.put(31, 32, "k", 4, Outcome::Ok);
    h.get(33, 34, "k", val(4));
    let r = h.check();
    assert_eq!(r.total(), 0, "{}", render(&r, 10));
    assert_eq!(r.observations, 7);
    assert_eq!(r.ops["put"].ok, 3);
}

#[test]
fn a_stale_read_after_an_upsert_is_caught_with_its_window() {
    let mut h = H::default();
    h.put(0, 10, "k", 1, Outcome::Ok);
    h.upsert(20, Some(30), "k", 2, Outcome::Ok);
    h.get(31, 32, "k", val(1));
    h.get(40, 41, "other", err(NF));
    let r = h.check();
    assert_eq!(counts(&r), [0, 0, 1, 0, 0], "{}", render(&r, 10));
    let v = &r.violations[0];
    assert_eq!(v.key, "k");
    assert!(v.what.contains("after upsert 0x2"), "{}", v.what);
    let text = v.window.join("\n");
    assert!(text.contains("w upsert k=0x2 -> ok"), "{text}");
    assert!(text.contains("r get k -> 0x1"), "{text}");
    assert!(!text.contains("other"), "{text}");
    // The upsert's acknowledgement is named, so the leader that gave it
    // can be: a violation set aside no longer counts.
    let at = v.acked_at.expect("the contradicted acknowledgement");
    let mut r = r;
    r.set_aside(|v| v.acked_at == Some(at));
    assert_eq!((r.total(), r.set_aside.len()), (0, 1));
    assert!(render(&r, 10).contains("set aside: no-stale-read on k"));
}

#[test]
fn a_read_of_a_removed_value_is_stale() {
    let mut h = H::default();
    h.upsert(0, Some(10), "k", 1, Outcome::Ok);
    h.remove(20, Some(30), "k", Outcome::Ok);
    h.get(31, 32, "k", val(1));
    let op = Op::Exist {
        keys: vec!["k".into()],
    };
    h.call(
        "r",
        33,
        Some(34),
        op,
        vec![Outcome::Exists { present: true }],
    );
    let r = h.check();
    assert_eq!(counts(&r), [0, 0, 2, 0, 0], "{}", render(&r, 10));
}

#[test]
fn a_lost_put_is_caught_and_one_that_comes_back_is_marked() {
    let mut h = H::default();
    h.put(0, 10, "lost", 1, Outcome::Ok);
    h.get(20, 21, "lost", err(NF));
    h.get(22, 23, "lost", err(NF));
    h.put(0, 10, "back", 2, Outcome::Ok);
    h.get(20, 21, "back", err(NF));
    h.get(30, 31, "back", val(2));
    let r = h.check();
    assert_eq!(counts(&r), [2, 0, 0, 0, 0], "{}", render(&r, 10));
    let lost = r.violations.iter().find(|v| v.key == "lost").unwrap();
    assert_eq!((lost.count, lost.came_back), (2, false));
    let back = r.violations.iter().find(|v| v.key == "back").unwrap();
    assert!(back.came_back);
    assert_eq!(r.came_back, 1);
}

#[test]
fn a_second_put_that_replaced_an_acknowledged_one_breaks_write_once() {
    let mut h = H::default();
    h.put(0, 10, "k", 1, Outcome::Ok);
    h.put(20, 30, "k", 2, Outcome::Ok);
    h.get(31, 32, "k", val(2));
    let r = h.check();
    assert_eq!(counts(&r), [1, 0, 0, 0, 0], "{}", render(&r, 10));
    assert!(r.violations[0].what.contains("put 0x1 lost"));
}

#[test]
fn a_removal_that_may_have_happened_explains_a_miss_and_a_new_put() {
    let mut h = H::default();
    h.put(0, 10, "k", 1, Outcome::Ok);
    // Timed out: may have removed the key at any time after 15.
    h.remove(15, Some(16), "k", err(-901));
    h.put(20, 30, "k", 2, Outcome::Ok);
    h.get(31, 32, "k", val(2));
    h.put(0, 10, "j", 3, Outcome::Ok);
    h.remove(15, None, "j", Outcome::Ok);
    h.get(31, 32, "j", err(NF));
    let r = h.check();
    assert_eq!(r.total(), 0, "{}", render(&r, 10));
}

#[test]
fn a_removal_answered_not_found_may_have_removed_on_an_earlier_attempt() {
    let mut h = H::default();
    h.upsert(0, Some(10), "k", 1, Outcome::Ok);
    // Its first attempt removed the key; the retry found nothing.
    h.remove(20, Some(30), "k", err(NF));
    h.get(40, 41, "k", err(NF));
    let r = h.check();
    assert_eq!(r.total(), 0, "{}", render(&r, 10));
    // But not after the call: a miss later still needs a removal.
    let mut h = H::default();
    h.upsert(0, Some(10), "k", 1, Outcome::Ok);
    h.remove(20, Some(30), "k", err(NF));
    h.upsert(31, Some(35), "k", 2, Outcome::Ok);
    h.get(40, 41, "k", err(NF));
    assert_eq!(counts(&h.check()), [1, 0, 0, 0, 0]);
}

#[test]
fn an_unfinished_upsert_may_land_late_but_a_finished_one_may_not() {
    let mut h = H::default();
    h.put(0, 10, "k", 1, Outcome::Ok);
    // Never completed: may take effect long after.
    h.upsert(11, None, "k", 2, Outcome::Ok);
    h.upsert(20, Some(30), "k", 3, Outcome::Ok);
    h.get(100, 101, "k", val(2));
    // A failed upsert too.
    h.upsert(102, Some(103), "k", 4, err(-1010));
    h.get(200, 201, "k", val(4));
    let r = h.check();
    assert_eq!(r.total(), 0, "{}", render(&r, 10));
    assert_eq!(r.ops["upsert"].unknown, 1);

    let mut h = H::default();
    h.upsert(0, Some(10), "k", 2, Outcome::Ok);
    h.upsert(20, Some(30), "k", 3, Outcome::Ok);
    h.get(100, 101, "k", val(2));
    assert_eq!(counts(&h.check()), [0, 0, 1, 0, 0]);
}

#[test]
fn unwritten_corrupt_and_future_values_are_caught() {
    let mut h = H::default();
    h.get(
        0,
        1,
        "k",
        Outcome::Corrupt {
            why: "no magic".into(),
        },
    );
    h.get(2, 3, "k", val(99));
    h.get(4, 5, "k", val(7));
    h.put(10, 20, "k", 7, Outcome::Ok);
    let op = Op::Exist {
        keys: vec!["never".into()],
    };
    h.call("r", 6, Some(7), op, vec![Outcome::Exists { present: true }]);
    let r = h.check();
    assert_eq!(counts(&r), [0, 0, 0, 4, 0], "{}", render(&r, 10));
}

#[test]
fn unclear_errors_are_caught_and_expected_ones_are_not() {
    let mut h = H::default();
    h.get(0, 1, "k", err(NF));
    h.get(0, 1, "k", err(-1010));
    h.remove(0, Some(1), "k", err(-706));
    h.put(0, 1, "k", 1, err(-1));
    h.put(0, 1, "k", 2, err(-1100));
    h.put(0, 1, "k", 3, err(-12345));
    h.get(
        0,
        1,
        "k",
        Outcome::Err {
            code: -900,
            msg: " ".into(),
        },
    );
    let r = h.check();
    assert_eq!(counts(&r), [0, 0, 0, 0, 4], "{}", render(&r, 10));
    assert_eq!(r.errors[&-704], 1);
}

#[test]
fn reported_evictions_excuse_misses_but_not_stale_reads() {
    let mut h = H::default();
    h.put(0, 10, "k", 1, Outcome::Ok);
    h.get(20, 21, "k", err(NF));
    h.put(0, 10, "j", 1, Outcome::Ok);
    h.upsert(20, Some(30), "j", 2, Outcome::Ok);
    h.get(40, 41, "j", val(1));
    let cfg = CheckConfig {
        evictions_possible: true,
        ..CheckConfig::default()
    };
    let r = check(&h.events, cfg);
    assert_eq!(counts(&r), [0, 0, 1, 0, 0], "{}", render(&r, 10));
}

#[test]
fn faults_overlapping_a_violation_are_in_its_window() {
    let mut h = H::default();
    h.upsert(0, Some(10), "k", 1, Outcome::Ok);
    h.upsert(20, Some(30), "k", 2, Outcome::Ok);
    h.events.push(Event::Fault {
        t: 25,
        n: 3,
        phase: "start".into(),
        kind: "split".into(),
        target: "a|b".into(),
    });
    h.events.push(Event::Fault {
        t: 45,
        n: 3,
        phase: "end".into(),
        kind: "split".into(),
        target: "a|b".into(),
    });
    h.events.push(Event::Fault {
        t: 1000,
        n: 4,
        phase: "start".into(),
        kind: "kill".into(),
        target: "later".into(),
    });
    h.get(31, 32, "k", val(1));
    let r = h.check();
    let text = r.violations[0].window.join("\n");
    assert!(text.contains("fault 3: split a|b"), "{text}");
    assert!(!text.contains("later"), "{text}");
}

#[test]
fn an_acked_write_unreadable_past_the_bound_is_caught_once() {
    assert_eq!(CheckConfig::default().unreadable_bound_ns, 30 * S);
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    let n = h.failing_gets(11, 51, "k");
    // Neither an exist answer nor a get that never answered ends the run.
    let op = Op::Exist {
        keys: vec!["k".into()],
    };
    h.call(
        "r",
        30 * S + 1,
        Some(30 * S + 2),
        op,
        vec![Outcome::Exists { present: true }],
    );
    let op = Op::Get {
        keys: vec!["k".into()],
    };
    h.call("r", 31 * S + 1, None, op, vec![]);
    let r = h.check();
    assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
    let v = &r.violations[0];
    assert_eq!((v.key.as_str(), v.count, v.came_back), ("k", n, false));
    assert!(
        v.what.contains("put 0x1 unreadable for 40.1s"),
        "{}",
        v.what
    );
    assert!(
        v.what.contains("(CHECKSUM_MISMATCH, TRANSFER_FAIL)"),
        "{}",
        v.what
    );
    let text = v.window.join("\n");
    assert!(
        text.contains("witness [0.000s .. 10.000s] w put k=0x1 -> ok"),
        "{text}"
    );
    assert!(
        text.contains("witness [11.000s .. 11.100s] r get k -> CHECKSUM_MISMATCH"),
        "{text}"
    );
    assert!(
        text.contains("witness [51.000s .. 51.100s] r get k -> CHECKSUM_MISMATCH"),
        "{text}"
    );
    assert!(render(&r, 10).contains("acked-write-unreadable on k (41 times)"));
}

#[test]
fn failures_within_the_bound_between_good_reads_are_no_violation() {
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    h.failing_gets(11, 21, "k");
    h.get(22 * S, 22 * S + 1, "k", val(1));
    // Longer than the bound in all, but a good read splits it.
    h.failing_gets(23, 47, "k");
    h.get(48 * S, 48 * S + 1, "k", val(1));
    let r = h.check();
    assert_eq!(r.total(), 0, "{}", render(&r, 10));
}

#[test]
fn failures_with_an_unobserved_gap_between_are_two_runs() {
    // Two outages of the object's store, nobody reading the key between:
    // it may have been readable then (a chaos run saw failures at 62 s and
    // at 98-104 s, on two faults of its store, and a good read after).
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    h.failing_gets(11, 28, "k");
    h.failing_gets(40, 58, "k");
    let r = h.check();
    assert_eq!(r.total(), 0, "{}", render(&r, 10));
    // A key read now and then (every 9 s) is observed throughout.
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    for t in (11..=56).step_by(9) {
        h.failing_gets(t, t, "k");
    }
    let r = h.check();
    assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
}

#[test]
fn failures_after_a_write_that_could_replace_the_acked_one_are_excused() {
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    h.failing_gets(11, 51, "k");
    // Timed out: may have replaced the put at any time after 16 s.
    h.upsert(16 * S, Some(17 * S), "k", 2, err(RPC_TIMEOUT));
    let r = h.check();
    assert_eq!(r.total(), 0, "{}", render(&r, 10));

    // Acknowledged, the upsert is held to the rule in its turn.
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    h.failing_gets(11, 51, "k");
    h.upsert(16 * S, Some(17 * S), "k", 2, Outcome::Ok);
    let r = h.check();
    assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
    let v = &r.violations[0];
    assert!(
        v.what.contains("upsert 0x2 unreadable for 33.1s"),
        "{}",
        v.what
    );
    assert_eq!(v.count, 34);
}

#[test]
fn a_destroyed_write_is_caught_though_a_later_upsert_covers_it() {
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    h.failing_gets(11, 46, "k");
    h.upsert(47 * S, Some(48 * S), "k", 2, Outcome::Ok);
    h.get(49 * S, 49 * S + 1, "k", val(2));
    let r = h.check();
    assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
    let v = &r.violations[0];
    assert!(
        v.what.contains("put 0x1 unreadable for 35.1s"),
        "{}",
        v.what
    );
    assert_eq!(v.count, 36);
}

#[test]
fn a_removal_that_may_precede_the_failures_excuses_them_unless_older() {
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    h.remove(10 * S + 1, Some(10 * S + 2), "k", err(RPC_TIMEOUT));
    h.failing_gets(11, 51, "k");
    h.put(0, 10 * S, "j", 1, Outcome::Ok);
    h.remove(10 * S + 1, Some(10 * S + 2), "j", Outcome::Ok);
    h.failing_gets(11, 51, "j");
    let r = h.check();
    assert_eq!(r.total(), 0, "{}", render(&r, 10));

    // A removal invoked before the put may land late, but would leave
    // the key not-found, not failing.
    let mut h = H::default();
    h.remove(S, Some(S + 1), "k", err(RPC_TIMEOUT));
    h.put(2 * S, 10 * S, "k", 1, Outcome::Ok);
    h.failing_gets(11, 51, "k");
    let r = h.check();
    assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
}

#[test]
fn not_found_is_rule_one_business_and_ends_a_failing_run() {
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    for t in 11..=51 {
        h.get(t * S, t * S + S / 10, "k", err(NF));
    }
    h.put(0, 10 * S, "j", 1, Outcome::Ok);
    h.failing_gets(11, 30, "j");
    h.get(31 * S, 31 * S + 1, "j", err(NF));
    h.failing_gets(32, 51, "j");
    let r = h.check();
    assert_eq!(counts(&r), [2, 0, 0, 0, 0], "{}", render(&r, 10));
}

#[test]
fn evictions_do_not_excuse_unreadable_writes() {
    let mut h = H::default();
    h.put(0, 10 * S, "k", 1, Outcome::Ok);
    h.failing_gets(11, 51, "k");
    let cfg = CheckConfig {
        evictions_possible: true,
        ..CheckConfig::default()
    };
    let r = check(&h.events, cfg);
    assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
}
