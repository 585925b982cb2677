//! The GetStream driver against a scripted GET runner: every bound a shim
//! could push on is held, and no answer reaches the wrong GET.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use futures::channel::mpsc as fmpsc;
use sluice_proto::common::TransferReport;

use super::*;

/// GETs by key: "ok" answers at once, "hold" when `release` is notified,
/// "slow" after a few ms; it counts GETs started, finished and dropped
/// unfinished (stopped).
#[derive(Default)]
struct Script {
    release: tokio::sync::Notify,
    started: AtomicUsize,
    finished: AtomicUsize,
    dropped: AtomicUsize,
}

struct CountDrop<'a>(&'a AtomicUsize, bool);
impl Drop for CountDrop<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, SeqCst);
        }
    }
}

fn runner(script: &Arc<Script>) -> RunGet {
    let script = script.clone();
    Arc::new(move |_session, item, ctx| {
        let script = script.clone();
        Box::pin(async move {
            script.started.fetch_add(1, SeqCst);
            let mut guard = CountDrop(&script.dropped, false);
            match item.key.as_str() {
                "hold" => script.release.notified().await,
                "panic" => panic!("a GET that panics"),
                "slow" => tokio::time::sleep(Duration::from_millis(5)).await,
                _ => {}
            }
            guard.1 = true;
            drop(guard);
            script.finished.fetch_add(1, SeqCst);
            let report = TransferReport { request_id: ctx.request_id, ..Default::default() };
            GetResult::Ok(pb::GetReply { report: Some(report), object_size: 0, etag: String::new() })
        })
    })
}

fn get(index: u32, key: &str) -> pb::StreamedGet {
    let item = pb::GetItem { key: key.into(), request_id: format!("r{index}-{key}"), ..Default::default() };
    pb::StreamedGet { index, session_id: "s".into(), item: Some(item) }
}

fn msg(gets: Vec<pb::StreamedGet>, cancel: Vec<u32>) -> Result<pb::GetStreamRequest, Status> {
    Ok(pb::GetStreamRequest { gets, cancel })
}

type Inbound = fmpsc::UnboundedSender<Result<pb::GetStreamRequest, Status>>;

fn open(script: &Arc<Script>, stop: Option<watch::Receiver<bool>>) -> (Inbound, ReceiverStream<Answer>) {
    let (tx, rx) = fmpsc::unbounded();
    (tx, start(runner(script), rx, stop))
}

async fn next(answers: &mut ReceiverStream<Answer>) -> Option<Answer> {
    tokio::time::timeout(Duration::from_secs(10), answers.next()).await.expect("an answer or the end in time")
}

/// The next answer: its index and request id, or its error code.
async fn next_item(answers: &mut ReceiverStream<Answer>) -> (u32, Result<String, i32>) {
    let item = next(answers).await.expect("not the end").expect("an item, not the stream's error");
    let got = match item.result.unwrap() {
        GetResult::Ok(r) => Ok(r.report.unwrap().request_id),
        GetResult::Error(d) => Err(d.code),
    };
    (item.index, got)
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn each_get_is_answered_under_its_index_and_the_stream_ends_after_the_shim() {
    let script = Arc::new(Script::default());
    let (tx, mut answers) = open(&script, None);
    tx.unbounded_send(msg(vec![get(7, "slow"), get(3, "ok"), get(9, "ok")], vec![])).unwrap();
    let mut got: Vec<_> = vec![next_item(&mut answers).await, next_item(&mut answers).await];
    drop(tx);
    got.push(next_item(&mut answers).await);
    got.sort();
    assert_eq!(got, vec![(3, Ok("r3-ok".into())), (7, Ok("r7-slow".into())), (9, Ok("r9-ok".into()))]);
    assert!(next(&mut answers).await.is_none(), "the shim closed its side: the end");
}

#[tokio::test]
async fn past_the_running_limit_gets_are_refused_and_cancels_still_read() {
    let script = Arc::new(Script::default());
    let (tx, mut answers) = open(&script, None);
    let mut index = 0;
    for _ in 0..STREAM_IN_FLIGHT / MAX_GETS_PER_MESSAGE {
        let gets = (0..MAX_GETS_PER_MESSAGE).map(|_| {
            index += 1;
            get(index, "hold")
        });
        tx.unbounded_send(msg(gets.collect(), vec![])).unwrap();
    }
    eventually("every GET started", || script.started.load(SeqCst) == STREAM_IN_FLIGHT).await;
    // At the limit the stream is still read: one more is refused at once,
    // and a cancel frees a place.
    tx.unbounded_send(msg(vec![get(10_000, "ok")], vec![])).unwrap();
    assert_eq!(next_item(&mut answers).await, (10_000, Err(ErrorCode::ResourceExhausted as i32)));
    tx.unbounded_send(msg(vec![], vec![1])).unwrap();
    eventually("the cancelled GET stopped", || script.dropped.load(SeqCst) == 1).await;
    tx.unbounded_send(msg(vec![get(10_001, "ok")], vec![])).unwrap();
    assert_eq!(next_item(&mut answers).await, (10_001, Ok("r10001-ok".into())));
    script.release.notify_waiters();
    for _ in 1..STREAM_IN_FLIGHT {
        assert!(next_item(&mut answers).await.1.is_ok());
    }
    assert_eq!(script.finished.load(SeqCst), STREAM_IN_FLIGHT, "511 held and one after the cancel");
}

#[tokio::test]
async fn a_get_cancelled_in_its_own_message_stops_and_an_earlier_gets_answer_never_lands_on_a_later_one() {
    let script = Arc::new(Script::default());
    let (tx, mut answers) = open(&script, None);
    // The shim may send a GET and its cancel together: it never runs.
    tx.unbounded_send(msg(vec![get(1, "hold")], vec![1])).unwrap();
    tx.unbounded_send(msg(vec![get(3, "ok")], vec![])).unwrap();
    assert_eq!(next_item(&mut answers).await, (3, Ok("r3-ok".into())));
    // Index 2: cancelled while running, then used again (a shim never
    // does, but nothing of the first may answer for the second).
    tx.unbounded_send(msg(vec![get(2, "hold")], vec![])).unwrap();
    eventually("started", || script.started.load(SeqCst) == 2).await;
    tx.unbounded_send(msg(vec![], vec![2])).unwrap();
    let mut second = get(2, "ok");
    second.item.as_mut().unwrap().request_id = "second".into();
    tx.unbounded_send(msg(vec![second], vec![])).unwrap();
    assert_eq!(next_item(&mut answers).await, (2, Ok("second".into())));
    script.release.notify_waiters();
    drop(tx);
    assert!(next(&mut answers).await.is_none(), "no answer for the stopped GETs");
    assert_eq!((script.finished.load(SeqCst), script.dropped.load(SeqCst)), (2, 1));
}

#[tokio::test]
async fn messages_that_break_the_rules_end_the_stream_and_stop_its_gets() {
    let too_many = (0..=MAX_GETS_PER_MESSAGE as u32).map(|i| get(100 + i, "ok")).collect();
    let no_item = vec![pb::StreamedGet { index: 5, session_id: "s".into(), item: None }];
    let twice = vec![get(1, "ok")];
    let twice_in_one = vec![get(7, "ok"), get(7, "ok")];
    let mut long_id = get(8, "ok");
    long_id.item.as_mut().unwrap().request_id = "x".repeat(MAX_REQUEST_ID + 1);
    let cases = [
        ("too many", too_many),
        ("no item", no_item),
        ("an index running", twice),
        ("an index twice", twice_in_one),
        ("a long request id", vec![get(9, "ok"), long_id]),
    ];
    for (what, bad) in cases {
        let script = Arc::new(Script::default());
        let (tx, mut answers) = open(&script, None);
        tx.unbounded_send(msg(vec![get(1, "hold")], vec![])).unwrap();
        eventually("started", || script.started.load(SeqCst) == 1).await;
        tx.unbounded_send(msg(bad, vec![])).unwrap();
        let end = next(&mut answers).await.expect("the stream's error");
        assert_eq!(end.unwrap_err().code(), tonic::Code::InvalidArgument, "{what}");
        assert!(next(&mut answers).await.is_none(), "{what}: then the end");
        eventually("the running GET stopped", || script.dropped.load(SeqCst) == 1).await;
        assert_eq!(script.started.load(SeqCst), 1, "{what}: nothing of the message started");
    }
}

#[tokio::test]
async fn gets_go_on_while_the_answers_are_not_read() {
    let script = Arc::new(Script::default());
    let (tx, mut answers) = open(&script, None);
    let n = 2 * ANSWERS_QUEUED as u32;
    for chunk in 0..n / 128 {
        tx.unbounded_send(msg((0..128).map(|i| get(chunk * 128 + i, "slow")).collect(), vec![])).unwrap();
    }
    // Nobody polls the answers; every GET still runs to its end.
    eventually("every GET finished unread", || script.finished.load(SeqCst) == n as usize).await;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..n {
        let (i, got) = next_item(&mut answers).await;
        assert!(got.is_ok() && seen.insert(i));
    }
}

#[tokio::test]
async fn a_shim_that_never_takes_its_answers_loses_the_stream() {
    let script = Arc::new(Script::default());
    let (tx, mut answers) = open(&script, None);
    let total = (ANSWERS_QUEUED + ANSWERS_UNSENT + MAX_GETS_PER_MESSAGE) as u32;
    let mut index = 0;
    while index < total {
        eventually("room to run", || script.started.load(SeqCst) - script.finished.load(SeqCst) < 256).await;
        // Refused once the stream has ended.
        let _ = tx.unbounded_send(msg((index..index + 256).map(|i| get(i, "ok")).collect(), vec![]));
        index += 256;
    }
    let mut read = 0;
    while let Some(a) = next(&mut answers).await {
        match a {
            Ok(_) => read += 1,
            Err(st) => assert_eq!(st.code(), tonic::Code::ResourceExhausted),
        }
    }
    // What was queued for the body; the rest was dropped with the stream.
    assert!(read <= ANSWERS_QUEUED, "{read} answers of {total}");
    assert!(tx.unbounded_send(msg(vec![get(0, "ok")], vec![])).is_err(), "and stopped reading");
}

#[tokio::test]
async fn stopping_refuses_new_gets_and_ends_once_those_running_are_answered() {
    let script = Arc::new(Script::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let (tx, mut answers) = open(&script, Some(stop_rx));
    tx.unbounded_send(msg(vec![get(1, "hold")], vec![])).unwrap();
    eventually("started", || script.started.load(SeqCst) == 1).await;
    stop_tx.send(true).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    tx.unbounded_send(msg(vec![get(2, "ok")], vec![])).unwrap();
    assert_eq!(next_item(&mut answers).await, (2, Err(ErrorCode::AgentUnavailable as i32)));
    script.release.notify_waiters();
    assert_eq!(next_item(&mut answers).await, (1, Ok("r1-hold".into())));
    assert!(next(&mut answers).await.is_none(), "the end, with the shim's side still open");
    drop(tx);
}

#[tokio::test]
async fn the_shim_going_away_stops_its_running_gets() {
    let script = Arc::new(Script::default());
    let (tx, answers) = open(&script, None);
    tx.unbounded_send(msg(vec![get(1, "hold"), get(2, "hold")], vec![])).unwrap();
    eventually("started", || script.started.load(SeqCst) == 2).await;
    drop(answers);
    eventually("both stopped", || script.dropped.load(SeqCst) == 2).await;
    drop(tx);
}

#[tokio::test]
async fn a_get_that_panics_is_answered_and_frees_its_place() {
    let script = Arc::new(Script::default());
    let (tx, mut answers) = open(&script, None);
    tx.unbounded_send(msg(vec![get(4, "panic")], vec![])).unwrap();
    assert_eq!(next_item(&mut answers).await, (4, Err(ErrorCode::Internal as i32)));
    // Its index is free again.
    tx.unbounded_send(msg(vec![get(4, "ok")], vec![])).unwrap();
    assert_eq!(next_item(&mut answers).await, (4, Ok("r4-ok".into())));
}

#[tokio::test]
async fn the_shims_side_failing_or_the_stop_signal_going_stops_the_stream() {
    let script = Arc::new(Script::default());
    let (tx, mut answers) = open(&script, None);
    tx.unbounded_send(msg(vec![get(1, "hold")], vec![])).unwrap();
    eventually("started", || script.started.load(SeqCst) == 1).await;
    tx.unbounded_send(Err(Status::cancelled("the shim's side broke"))).unwrap();
    assert!(next(&mut answers).await.is_none());
    eventually("its GET stopped", || script.dropped.load(SeqCst) == 1).await;

    // The agent's stop signal dropped (its run gone): a stop, and with
    // nothing running the stream ends at once, its side still open.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (tx, mut answers) = open(&script, Some(stop_rx));
    drop(stop_tx);
    assert!(next(&mut answers).await.is_none());
    assert!(tx.unbounded_send(msg(vec![get(2, "ok")], vec![])).is_err(), "no longer read");
}

#[tokio::test]
async fn only_the_get_now_under_an_index_answers_for_it() {
    let script = Arc::new(Script::default());
    let (answers, _rx) = mpsc::channel(1);
    let mut driver = Driver::new(runner(&script), answers);
    let task = tokio::spawn(std::future::pending::<()>());
    driver.running.insert(3, Running { generation: 2, task: task.abort_handle() });
    assert!(!driver.finished(3, 1), "a stopped GET's late answer");
    assert!(!driver.finished(4, 2), "an index not running");
    assert!(driver.finished(3, 2));
    assert!(driver.running.is_empty());
    task.abort();
}
