//! The xvs flow table (conntrack): a fixed-capacity, lock-free table of flows shared by every
//! fastpath worker.
//!
//! # Contract
//!
//! - Allocated once in [`FlowTable::new`] (anonymous memory) or [`FlowTable::open`] (a state
//!   file that outlives the process: the next process of the boot adopts its flows after a
//!   recovery pass; see `table/persist.rs`); nothing allocates afterwards.
//! - No clock is read on the table's paths. Time is a [`Tick`]: 100 ms since the table's
//!   epoch (the one given to `new`; boot, for a state file, whose epoch every later process
//!   shares). [`FlowTable::tick`] is the one conversion from an `Instant` (a worker makes it
//!   once per batch); every method that takes a flow's time takes a `Tick`. `Instant`s are
//!   only at the table's edges: the epoch (`new`, `open`), the copies handed out
//!   ([`FlowView::last_seen`], [`ExpiredFlow::last_seen`]) and the export files, which
//!   outlive the process (`export`, `import_records`).
//! - Every flow is reachable by its **original** tuple (client → VIP) and its **reply** tuple
//!   (backend → SNAT address, or client in nat mode); both lead to one entry.
//!   [`FlowTable::lookup`] says which direction matched.
//! - Lookups are wait-free (a bounded probe plus validated reads); inserts, state updates,
//!   removals and sweeps are lock-free (CAS loops).
//! - TCP state follows IPVS's table ([`state`]), with per-state idle timeouts ([`Timeouts`]).
//!   Expiry is a bounded incremental [`FlowTable::sweep`]; there are no timers.
//! - When full, an insert recycles an *embryonic* (handshake not completed) or expired flow
//!   found near the new flow's hash, or fails with [`InsertError::Full`]: established
//!   connections are never pushed out.
//! - Per-backend active (TCP ESTABLISHED) / inactive (every other live state) counts, exposed
//!   through [`lb_algos::ConnCounts`].
//!
//! # Who calls what
//!
//! A worker reads the clock once per batch and converts it, `let now = table.tick(clock)`;
//! every call below then takes that [`Tick`]. Per packet:
//!
//! - an IPv4 TCP/UDP/SCTP packet (the pipeline's fast path): [`FlowTable::v4_key`] (the
//!   tuple packed as the frame holds it, hashed once), [`FlowTable::lookup_v4`] (a 32-byte
//!   [`V4Hit`]: the rewrite and its checksum adjustment) and [`FlowTable::touch_v4`]; on a
//!   miss, [`FlowTable::insert_v4`] (a [`V4Flow`]), which also comes in two halves
//!   ([`FlowTable::insert_v4_begin`], [`FlowTable::insert_v4_finish`]) so that a worker can do
//!   other work while the reply tuple's index slot is fetched. A receive batch overlaps its
//!   cache misses with [`FlowTable::prefetch_index_v4`] then [`FlowTable::prefetch_entry_v4`].
//! - any other packet: [`FlowTable::lookup_hit`] (a small `Copy` [`FlowHit`] with the
//!   translated endpoints) and [`FlowTable::touch`]; on a miss, [`FlowTable::insert`] (a
//!   [`FlowData`]).
//! - around them: [`FlowTable::get`] and [`FlowTable::on_packet`] by handle,
//!   [`FlowTable::remove`] (a reused tuple), [`FlowTable::give_way`] and
//!   [`FlowTable::embryonic_idle`] (SNAT ports under pressure), the SYN proxy's
//!   [`FlowTable::seq`] word, [`FlowTable::lookup`] (an ICMP error's quoted tuple).
//! - once per poll, a slice of the table: [`FlowTable::sweep`].
//!
//! The slowpath finds and copies flows with [`FlowTable::lookup`], [`FlowTable::get`] and
//! [`FlowTable::scan`], ends them with [`FlowTable::remove`], installs a peer's with
//! [`FlowTable::restore`] and [`FlowTable::update`], reads [`FlowTable::stats`] and
//! [`FlowTable::under_pressure`], and keeps the table across restarts ([`FlowTable::open`],
//! [`FlowTable::mark_clean`], [`FlowTable::export`], [`FlowTable::import_records`],
//! [`FlowTable::import_state`]). The flowtable bench also measures
//! [`FlowTable::lookup_batch`], the same overlap for a batch of [`FlowKey`]s.
//!
//! A new connection through a worker:
//!
//! ```
//! use flowtable::*;
//! use std::net::Ipv4Addr;
//! use std::time::Instant;
//!
//! let table = FlowTable::new(FlowTableConfig::new(1024, 16), Instant::now()).unwrap();
//! // Addresses and ports packed as the fast path reads them from a frame: network order.
//! let pack = |src: Ipv4Addr, dst: Ipv4Addr| {
//!     v4_addrs_be(u64::from(src.to_bits()) | u64::from(dst.to_bits()) << 32)
//! };
//! let ports = |src: u16, dst: u16| v4_ports_be(u32::from(src) | u32::from(dst) << 16);
//! let (client, vip) = ([198, 18, 0, 1].into(), [198, 18, 100, 1].into());
//! let (backend, snat) = ([198, 18, 1, 1].into(), [198, 18, 0, 254].into());
//!
//! // Once per batch.
//! let now = table.tick(Instant::now());
//!
//! // The client's SYN: a miss. Schedule a backend, take a SNAT port, index both tuples.
//! let key = table.v4_key(Protocol::Tcp, pack(client, vip), ports(40000, 80));
//! assert!(table.lookup_v4(&key).is_none());
//! let reply = table.v4_key(Protocol::Tcp, pack(backend, snat), ports(8080, 20000));
//! let flow = V4Flow {
//!     original: key,
//!     reply,
//!     service_id: 1,
//!     backend_id: BackendId(0),
//!     snapshot_gen: 1,
//!     flags: 0,
//! };
//! table.insert_v4(&flow, TcpFlags::SYN, now).unwrap();
//!
//! // The backend's SYN-ACK finds the flow by its reply tuple; here through a `FlowKey`, the
//! // path of every packet the IPv4 one does not take (IPv6, IP options, ICMP...).
//! let answer = FlowKey::v4(Protocol::Tcp, backend, 8080, snat, 20000);
//! let hit = table.lookup_hit(&answer).unwrap();
//! assert_eq!((hit.dir, hit.dst_ip(), hit.dst_port), (Direction::Reply, client.into(), 40000));
//! table.touch(&hit, TcpFlags(0x12), now, || 0);
//!
//! // The client's ACK: a hit. Rewrite the frame to `hit.addrs()` and `hit.ports`, adjust its
//! // checksums by `hit.csum_delta`, and account the packet.
//! let hit = table.lookup_v4(&key).unwrap();
//! assert_eq!((hit.dir(), hit.dst()), (Direction::Original, backend.to_bits().to_be()));
//! let state = table.touch_v4(&hit, TcpFlags::ACK, now, || 0);
//! assert_eq!(state, Some(FlowState::Tcp(TcpState::Established)));
//!
//! // Once per poll: expire what is idle in the next slice of the table.
//! let mut ended = 0;
//! table.sweep(now, 256, |_| ended += 1);
//! assert_eq!((ended, table.len()), (0, 1));
//! ```
//!
//! # Memory layout
//!
//! One region (`table/store.rs`): a header page (layout version, geometry, boot id, clock
//! epoch, hash seed, owner, and the shared scalars: free-list head, counters, sweep cursor),
//! then the entries, the index and the backend counts, page-aligned. A state file is exactly
//! that region.
//!
//! - **Entries**: one slab of `capacity` entries. The hot line (64 bytes, cache-line
//!   aligned, eight `AtomicU64`): a control word `gen:22 | status:2 | state:8 | last_seen:32`,
//!   one word of four ports (each in network byte order), one of service/backend id, one of
//!   snapshot generation / protocol / family / flags, three address words and the sequence
//!   word. An IPv4 flow's address words hold its four addresses (two per word, each in
//!   network byte order, as a frame carries them: the per-packet path compares and writes
//!   them without a byte swap) and both directions' checksum
//!   adjustments ([`v4_csum_delta`], TTL decrement included: [`v4_forward_delta`]): an IPv4
//!   lookup, and its rewrite
//!   ([`FlowTable::lookup_hit`]), touch one entry line. An IPv6 flow's hold its client and
//!   the number of a second entry, its **extension** (taken from the free list with it, its
//!   control word left FREE), which holds its VIP, backend and SNAT addresses: an IPv6 flow
//!   takes two entries, so a table holds `capacity` IPv4 flows or `capacity / 2` IPv6 ones.
//! - **Index**: `3.2 × capacity` `u64` home words (two tuples per flow, load factor ≤ 0.625)
//!   and a tail of one probe length, so no probe sequence wraps round; linear
//!   probing with a fast-range home slot. A word is `tag:31 | dir:1 | entry+1:32`; tuples are
//!   not stored twice, candidates are confirmed against the entry's fields.
//! - About 90 bytes per flow in all ([`FlowTable::bytes_per_flow`]).
//!
//! # Concurrency protocol
//!
//! **Entry life cycle.** FREE → INSERTING → LIVE → DYING → FREE, in the control word. Free
//! entries sit on a Treiber stack whose head carries an ABA tag; the link is kept in the
//! free entry's id word. An inserter that pops an entry (and, for an IPv6 flow, a second one,
//! its extension) owns it: it bumps the generation, issues a release fence, writes the data
//! words (the extension's included), and stores INSERTING with release. Whoever frees the
//! entry (stores FREE) pushes its extension back on the free list after that store, so a
//! reader that went from the entry to its extension and read a recycled extension's words
//! fails its validation like any reader racing a recycler. Data words
//! never change while the entry is INSERTING or LIVE; state and last-seen live in the control
//! word and change only by CAS (`on_packet`), so every control-word transition is serialized
//! and each winner adjusts the backend counts for exactly the transition it made.
//!
//! **Readers** (seqlock style): load the control word (acquire), require INSERTING/LIVE (and the
//! handle's generation), read the data words (relaxed atomics: racy but never UB), acquire fence,
//! reload the control word and require the same generation, still readable. A reader racing a
//! recycler therefore never returns a torn or recycled entry: the recycler's data stores come
//! after its release fence, which follows the DYING/FREE store that the recheck then sees.
//!
//! **Publishing.** After INSERTING the inserter publishes the original tuple's index word, then
//! the reply tuple's. Index inserts claim the first EMPTY or tombstone slot, by CAS, after
//! walking the probe window to its first EMPTY slot and comparing every tag-matching word
//! against its entry. Two workers inserting the same new flow: each, after its CAS, walks the
//! probe path again (SeqCst, as are claims), so at least one sees the other's word; whoever
//! sees another same-key word withdraws its own and retries, and the retry's walk finds the
//! survivor: it tears its own entry down and gets [`InsertError::Exists`] with the winner's
//! handle. Only when both tuples are indexed does the entry become LIVE; until then no one else
//! can remove it, which keeps the "one index word per (entry, direction)" invariant that
//! removal relies on. A reply tuple already used by another flow gives
//! [`InsertError::ReplyInUse`] and the original word is withdrawn. A two-step IPv4 insert
//! takes exactly these steps, with the inserter's other work (other inserts and lookups
//! included) between the two words: to everyone else it is an inserter that got slow.
//!
//! **Counts.** `len` is `inserted - departed`: an insert counts once, when both words are
//! published (a torn-down attempt counts nothing), and the winner of a removal counts the
//! departure.
//!
//! **Removal** (remove, expiry, recycling): CAS LIVE → DYING picks the one winner; it tombstones
//! both index words (CAS of the exact word to TOMB), decrements the counts for the state it
//! saw, stores FREE and pushes the entry on the free list. Only after that can the entry be
//! reused, so no stale index word ever points to a new incarnation.
//!
//! **Tombstones.** Inserts reuse them (a SYN flood recycles half-open flows as fast as they
//! come; tombstones that only cleanups could empty would fill the index). Sweeps turn them
//! back into EMPTY (so that probes stay short): a TOMB at `p` may
//! become EMPTY only if no live word between `p` and the next EMPTY slot `q` has its home at
//! or before `p`; `q` is frozen (CAS EMPTY → FROZEN) during the change so no insert claims it
//! in between. Readers treat FROZEN as EMPTY; inserts wait for it. An insert whose claim raced
//! a cleanup could end up beyond a fresh EMPTY slot, so after claiming it walks forward from
//! its slot to the first EMPTY slot (a FROZEN one on the way: retry), then rescans `[home,
//! claimed)` (an EMPTY/FROZEN slot: retry); `Index::insert` explains why the two walks
//! suffice. Probes are bounded by `MAX_PROBE` slots (128).
//!
//! The core of this (two inserts of one flow, insert vs. remove vs. lookup, insert vs. cleanup)
//! is model-checked with loom: `RUSTFLAGS="--cfg loom" cargo test -p flowtable --release --test
//! loom`.

#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod index;
pub mod key;
#[cfg(not(loom))]
pub mod log;
mod mem;
pub mod state;
mod sync;
mod table;

pub use key::{Direction, FlowData, FlowKey, Protocol};
pub use lb_algos::{BackendId, ConnCounts};
#[cfg(not(loom))]
pub use shm::Refusal;
pub use state::{FlowState, SctpState, TcpFlags, TcpState, Timeouts};
#[cfg(feature = "testing")]
pub use table::PRESSURE_HOLD_TICKS;
#[cfg(not(loom))]
pub use table::{
    AnyFlow, FlowCheck, FlowRecord, Handed, Imported, Opened, RECORD_BYTES, RECORD_VERSION,
    Recovery, previous_path,
};
pub use table::{
    CAPACITY_MAX, Error, ExpiredFlow, FLAG_ONE_WAY, FLAG_SLOW, FlowHandle, FlowHit, FlowTable,
    FlowTableConfig, FlowTableStats, FlowView, InsertError, PendingV4, RST_AHEAD_BYTES,
    RST_BEHIND_BYTES, RstWindow, SEQ_BITS, SweepStats, Tick, V4Flow, V4Hit, V4Key, v4_addrs_be,
    v4_csum_delta, v4_csum_delta_be, v4_forward_delta, v4_ports_be, v4_wire_word,
};
