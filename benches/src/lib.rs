//! Shared helpers for the benchmark binaries.
