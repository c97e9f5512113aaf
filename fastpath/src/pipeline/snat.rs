//! Per-worker fullnat source ports.
//!
//! Each worker owns a disjoint slice of `[dataplane] snat_port_range` ([`slice`]), so two
//! workers never hand out the same (SNAT address, port). Within its slice a worker walks a
//! cursor; uniqueness of the reply tuple (backend → SNAT address:port) is enforced by the flow
//! table's insert, which refuses a reply tuple in use, so the pipeline just tries the next
//! port. A port is free again as soon as the flow holding it leaves the table: there is no
//! free list to keep in sync with expiry, and one port may serve many backends at once.

/// Worker `worker`'s share of `first..=last` split evenly between `workers` (the first
/// `len % workers` workers get one port more). A worker beyond the range's size, or
/// `workers == 0`, shares the whole range (collisions are still caught by the flow table).
pub fn slice(first: u16, last: u16, worker: usize, workers: usize) -> (u16, u16) {
    let len = usize::from(last.saturating_sub(first)) + 1;
    if workers == 0 || worker >= workers || len < workers {
        return (first, last.max(first));
    }
    let base = len / workers;
    let extra = len % workers;
    let start = worker * base + worker.min(extra);
    let n = base + usize::from(worker < extra);
    // start + n - 1 < len <= 65536, and first + that <= last: fits in u16.
    let lo = usize::from(first) + start;
    (lo as u16, (lo + n - 1) as u16)
}

/// A cursor over one worker's port slice.
#[derive(Clone, Debug)]
pub struct SnatPorts {
    first: u16,
    len: u32,
    next: u32,
}

impl SnatPorts {
    /// Ports `first..=last` (swapped if given backwards).
    pub fn new(first: u16, last: u16) -> Self {
        let (first, last) = if first <= last {
            (first, last)
        } else {
            (last, first)
        };
        SnatPorts {
            first,
            len: u32::from(last - first) + 1,
            next: 0,
        }
    }

    /// The cursor moved to the `start`-th port of the slice (modulo its length).
    pub fn starting_at(self, start: u32) -> Self {
        SnatPorts {
            next: start % self.len,
            ..self
        }
    }

    /// Ports in the slice.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The next candidate port.
    #[inline]
    pub fn next_port(&mut self) -> u16 {
        let p = self.first as u32 + self.next;
        self.next += 1;
        if self.next == self.len {
            self.next = 0;
        }
        p as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_disjoint_and_cover_the_range() {
        for workers in 1..9 {
            let mut seen = Vec::new();
            for w in 0..workers {
                let (a, b) = slice(1024, 65535, w, workers);
                assert!(a <= b);
                seen.extend(a..=b);
            }
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), 65535 - 1024 + 1, "{workers} workers");
        }
        assert_eq!(slice(10, 12, 0, 5), (10, 12));
        assert_eq!(slice(1, 65535, 0, 1), (1, 65535));
    }

    #[test]
    fn a_cursor_starts_where_it_is_told_and_still_covers_the_slice() {
        let mut s = SnatPorts::new(40000, 40009).starting_at(13);
        let ports: Vec<u16> = (0..10).map(|_| s.next_port()).collect();
        assert_eq!(ports[0], 40003);
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (40000..=40009).collect::<Vec<_>>());
        // Random starts differ from run to run (8 draws over 1,000 ports all equal: 1e-21).
        let cfg = crate::pipeline::PipelineConfig {
            snat_ports: (40000, 40999),
            ..crate::pipeline::PipelineConfig::from_config(&config::Config::default(), 0, 1)
        };
        let starts: Vec<u32> = (0..8)
            .map(|_| cfg.clone().with_random_snat_start().snat_start % 1000)
            .collect();
        assert!(starts.iter().any(|s| *s != starts[0]), "{starts:?}");
    }

    #[test]
    fn cursor_wraps() {
        let mut s = SnatPorts::new(65534, 65535);
        assert_eq!(
            [s.next_port(), s.next_port(), s.next_port()],
            [65534, 65535, 65534]
        );
        assert_eq!(s.len(), 2);
    }
}
