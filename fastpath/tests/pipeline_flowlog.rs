//! The flow log (flow sync's worker side): a pipeline with a log records every flow it
//! creates and every state change it makes, on the IPv4 shortcut, the batched path and the
//! general path (IPv6), and nothing for packets that change no state.

use std::sync::Arc;
use std::time::Instant;

use fastpath::flowlog::{FlowEvent, FlowLog};
use fastpath::pipeline::{Pipeline, Verdict};
use fastpath::testing::*;
use flowtable::{FlowHandle, FlowState, TcpState};

const V6: &str = r#"
[[services]]
name = "two6"
vip = "2001:2:0:100::20"
port = 80
protocol = "tcp"
scheduler = "rr"
backends = [{ addr = "[2001:2:0:1::1]:80" }, { addr = "[2001:2:0:1::2]:80" }]
"#;

fn drain(log: &FlowLog) -> Vec<FlowEvent> {
    std::iter::from_fn(|| log.pop()).collect()
}

/// One frame through `p`, one at a time or as a batch of one.
fn run(p: &mut Pipeline, f: &mut [u8], now: Instant, batched: bool) -> Verdict {
    if batched {
        let mut v = [Verdict::Pass];
        let mut refs = [&mut f[..]];
        p.process_batch(&mut refs, now, &mut v);
        v[0]
    } else {
        p.process(f, now)
    }
}

fn handshake(client: &str, vip: &str, batched: bool) {
    let epoch = Instant::now();
    let mut p = pipeline_from(&(CONFIG.to_owned() + V6), epoch);
    let log = Arc::new(FlowLog::new(64));
    p.set_flow_log(Arc::clone(&log));
    let (client, vip) = (sa(client), sa(vip));
    let now = at(epoch, 10);

    let mut syn = frame(CLIENT_MAC, XVS_MAC, client, vip, 64, SYN);
    assert!(matches!(
        run(&mut p, &mut syn, now, batched),
        Verdict::Tx(_)
    ));
    let events = drain(&log);
    let [FlowEvent::Created(h)] = events[..] else {
        panic!("one Created event, got {events:?}");
    };
    let v = p.flows().get(h).expect("the logged handle names the flow");
    assert_eq!(v.data.client, client);

    // The backend answers (to the SNAT address), the client acknowledges: the flow becomes
    // established; each change is logged by the same handle.
    let d = v.data;
    let mut synack = frame(B1_MAC, XVS_MAC, d.backend, d.snat, 64, SYNACK);
    assert!(matches!(
        run(&mut p, &mut synack, now, batched),
        Verdict::Tx(_)
    ));
    let mut ack = frame(CLIENT_MAC, XVS_MAC, client, vip, 64, ACK);
    assert!(matches!(
        run(&mut p, &mut ack, now, batched),
        Verdict::Tx(_)
    ));
    let events = drain(&log);
    assert!(!events.is_empty(), "state changes were logged");
    assert!(
        events.iter().all(|e| *e == FlowEvent::Changed(h)),
        "{events:?}"
    );
    assert_eq!(
        p.flows().get(h).unwrap().state,
        FlowState::Tcp(TcpState::Established)
    );
    // More of the same changes nothing: nothing logged.
    for _ in 0..3 {
        let mut ack = frame(CLIENT_MAC, XVS_MAC, client, vip, 64, ACK);
        run(&mut p, &mut ack, now, batched);
    }
    assert_eq!(drain(&log), Vec::<FlowEvent>::new());
    // A FIN is a change again.
    let mut fin = frame(CLIENT_MAC, XVS_MAC, client, vip, 64, FIN);
    run(&mut p, &mut fin, now, batched);
    assert_eq!(drain(&log), vec![FlowEvent::Changed(h)]);
    let _: FlowHandle = h;
}

#[test]
fn the_ipv4_shortcut_logs_creations_and_changes() {
    handshake("198.18.0.1:1000", "198.18.100.20:80", false);
}

#[test]
fn the_batched_path_logs_creations_and_changes() {
    handshake("198.18.0.1:1001", "198.18.100.20:80", true);
}

#[test]
fn the_general_path_logs_creations_and_changes() {
    handshake("[2001:2::1]:1000", "[2001:2:0:100::20]:80", false);
}

#[test]
fn without_a_log_nothing_is_recorded_and_forwarding_is_the_same() {
    let epoch = Instant::now();
    let mut with = pipeline(epoch);
    let mut without = pipeline(epoch);
    let log = Arc::new(FlowLog::new(4));
    with.set_flow_log(Arc::clone(&log));
    for port in 2000..2010u16 {
        let c = sa(&format!("198.18.0.1:{port}"));
        let mut a = frame(CLIENT_MAC, XVS_MAC, c, sa("198.18.100.20:80"), 64, SYN);
        let mut b = a.clone();
        let (va, vb) = (with.process(&mut a, epoch), without.process(&mut b, epoch));
        assert_eq!(va, vb);
        assert_eq!(a, b, "same bytes out");
    }
    // A log of 4 took 4 and counted the 6 it had no room for.
    assert_eq!((log.len(), log.dropped()), (4, 6));
    assert!(without.flow_log().is_none());
}
