//! The caches' counters, merged into the device's for reports.

use super::*;

/// Add what a cache counted to a device's counters.
pub fn add_counts(s: &mut DeviceStats, c: &CacheCounts) {
    s.allocs += c.allocs;
    s.frees += c.frees;
    s.hits += c.hits;
    s.thread_cache_hits += c.hits;
    s.allocated.total_in += c.allocated_in;
    s.allocated.total_out += c.allocated_out;
    s.requested.total_in += c.requested_in;
    s.requested.total_out += c.requested_out;
    s.blocks.total_in += c.allocs;
    s.blocks.total_out += c.frees;
    s.fences += c.fences;
    s.fence_ns += c.fence_ns;
    s.barriers += c.barriers;
    for (h, n) in s.histogram.iter_mut().zip(c.histogram.iter()) {
        *h += n;
    }
}

/// A device's counters with what its caches hold and counted: current values exclude the free
/// blocks the caches hold (the device counts them as allocated), and what the program holds is
/// counted at its requested size. Peaks stay the device's, which counted cached blocks as
/// allocated: with thread caches in use they may exceed the true peak by what the caches held.
pub fn merge_into(s: &mut DeviceStats, st: &CacheState) {
    add_counts(s, &st.counts);
    let held = st.held_bytes() + st.transit.bytes;
    let held_blocks = st.held_count() + st.transit.count;
    s.allocated.current = s.allocated.current.saturating_sub(held);
    s.requested.current = s.requested.current.saturating_sub(held + st.out_slack);
    s.blocks.current = s.blocks.current.saturating_sub(held_blocks);
}
