//! perf-lab: the xvs benchmark rig (issue 7).
