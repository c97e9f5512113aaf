//! Where the table's memory lives: a [`shm::Mapping`], anonymous (a table of this process
//! only) or of a state file (a table that outlives the process, [`crate::FlowTable::open`]),
//! carved into typed slabs of [`shm::Plain`] types.
//!
//! Under loom the atomics are loom's, which are not plain memory: there the slabs are boxes
//! and nothing is mapped.

#[cfg(not(loom))]
pub(crate) use shm::{Mapping, One, PAGE, Slab, page_round};

#[cfg(loom)]
pub(crate) use loom_slabs::{One, Slab, page_round};

#[cfg(loom)]
mod loom_slabs {
    use std::ops::Deref;

    /// A boxed slice standing in for a mapped slab.
    pub(crate) struct Slab<T>(Box<[T]>);

    impl<T> Slab<T> {
        pub(crate) fn boxed(b: Box<[T]>) -> Slab<T> {
            Slab(b)
        }
    }

    impl<T> Deref for Slab<T> {
        type Target = [T];
        fn deref(&self) -> &[T] {
            &self.0
        }
    }

    /// A boxed value standing in for a mapped one.
    pub(crate) struct One<T>(Box<T>);

    impl<T> One<T> {
        pub(crate) fn boxed(v: T) -> One<T> {
            One(Box::new(v))
        }
    }

    impl<T> Deref for One<T> {
        type Target = T;
        fn deref(&self) -> &T {
            &self.0
        }
    }

    pub(crate) const fn page_round(n: usize) -> usize {
        n.div_ceil(4096) * 4096
    }
}
