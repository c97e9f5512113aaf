//! The xvs flow table (conntrack). See the crate docs once written.
