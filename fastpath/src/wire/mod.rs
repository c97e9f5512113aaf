//! Zero-copy packet views (smoltcp style).
