//! The invariants checked after every step, the pool's figures against the model's.

use super::*;

/// Whether a live block of the model lies in `[addr, addr + bytes)` or reaches into it.
pub(crate) fn touched(m: &Reference, addr: Addr, bytes: u64) -> bool {
    // Live blocks do not overlap: only the last one starting before the end can reach in.
    m.live
        .range(..addr + bytes)
        .next_back()
        .is_some_and(|(&b, &(_, len, _))| b + len > addr)
}

/// Per device, the bytes the driver must hold for the model's live blocks: the classic
/// segments they lie in and the granules they touch. Everything else the pool can give back.
pub(crate) fn held_for_live(
    segments: &BTreeMap<Addr, Segment>,
    m: &Reference,
) -> [u64; DEVICES as usize] {
    let mut held = [0; DEVICES as usize];
    // Both in address order, and live blocks do not overlap: one walk over the two.
    let mut live = m.live.iter().peekable();
    for (&a, seg) in segments {
        while live.next_if(|(&b, &(_, len, _))| b + len <= a).is_some() {}
        if live.peek().is_some_and(|(&b, _)| b < a + seg.bytes) {
            held[seg.device as usize] += seg.bytes;
        }
    }
    held
}

/// What an expandable segment of `dev` must map to serve `len` bytes once every free granule
/// went back: the fewest bytes a block at the start or the end of some hole between live blocks
/// needs (the granules it touches that no live block touches; the whole hole if the rest would
/// be too small to split off), and the whole granules of a new placement.
pub(crate) fn least_to_map(
    driver: &Driver,
    m: &Reference,
    dev: u32,
    len: u64,
) -> Option<(u64, u64)> {
    let g = VMM_GRANULE;
    let fresh = len.checked_next_multiple_of(g)?;
    let ranges = driver.with(|s| s.ranges.clone());
    let mut least = fresh;
    for (&base, &(_, bytes)) in ranges.iter().filter(|(_, r)| r.0 == dev) {
        let end = base + bytes;
        let mut lives = m.live.range(base..end).map(|(&b, &(_, n, _))| (b, n));
        // The holes: from the range's start or a live block's end to the next live block.
        let mut from = base;
        loop {
            let next = lives.next();
            let to = next.map_or(end, |(b, _)| b);
            if to - from >= len {
                let rest = to - from - len;
                let take = if rest > LARGE_SPLIT_REMAINDER {
                    len
                } else {
                    to - from
                };
                // The granules the live blocks around the hole touch.
                let before = (from != base).then(|| (from - 1 - base) / g);
                let after = (to != end).then(|| (to - base) / g);
                for at in [from, to - take] {
                    let (first, last) = ((at - base) / g, (at + take - 1 - base) / g);
                    let shared = (first..=last)
                        .filter(|&k| before == Some(k) || after == Some(k))
                        .count() as u64;
                    least = least.min((last - first + 1 - shared) * g);
                }
            }
            match next {
                Some((b, n)) => from = b + n,
                None => break,
            }
        }
    }
    Some((least, fresh))
}

/// Whether `[addr, addr + len)` lies in segments of `dev` that follow one another without a
/// hole: one classic segment, or granules mapped side by side.
pub(crate) fn covered(segments: &BTreeMap<Addr, Segment>, dev: u32, addr: Addr, len: u64) -> bool {
    let Some((&first, _)) = segments.range(..=addr).next_back() else {
        return false;
    };
    let mut at = first;
    for (&s, seg) in segments.range(first..) {
        if s != at || seg.device != dev {
            return false;
        }
        at = s + seg.bytes;
        if at >= addr + len {
            return true;
        }
    }
    false
}

pub(crate) fn check(
    pool: &Pool<Driver>,
    m: &Reference,
    release: Option<(u32, Released)>,
) -> Result<(), String> {
    pool.check_settled()?;
    let driver = pool.backend();
    let segments = driver.model.segments();
    let delivered = driver.model.delivered();
    let mut violations = driver.model.misuses();
    violations.extend(driver.with(|s| s.violations.clone()));
    if let Some(v) = violations.first() {
        return fail(v.clone());
    }
    for (&addr, &(dev, len, _)) in &m.live {
        if !covered(&segments, dev, addr, len) {
            return fail(format!(
                "live {addr:#x}+{len} (device {dev}) is not in memory the driver gave its \
                 device"
            ));
        }
    }
    // Per device: the driver's bytes, and those of them mapped into reserved ranges.
    let mut held = [(0u64, 0u64); DEVICES as usize];
    for seg in segments.values() {
        held[seg.device as usize].0 += seg.bytes;
    }
    driver.with(|s| {
        for &(dev, bytes) in s.mappings.values() {
            held[dev as usize].1 += bytes;
        }
    });
    let live_held = held_for_live(&segments, m);
    let mut ranges = 0;
    for dev in pool.used_devices() {
        let snap = pool.device_stats(dev).ok_or("no statistics")?;
        let (reserved, mapped) = held[dev as usize];
        let allocated: u64 = m.live.values().filter(|v| v.0 == dev).map(|v| v.1).sum();
        let requested: u64 = m.live.values().filter(|v| v.0 == dev).map(|v| v.2).sum();
        let st = &snap.stats;
        if st.reserved.current != reserved
            || snap.figures.mapped != mapped
            || st.allocated.current != allocated
            || st.requested.current != requested
        {
            return fail(format!(
                "device {dev}: pool says reserved {} (mapped {}) allocated {} requested {}, \
                 model {reserved} (mapped {mapped}, classic {}) {allocated} {requested}",
                st.reserved.current,
                snap.figures.mapped,
                st.allocated.current,
                st.requested.current,
                reserved - mapped
            ));
        }
        ranges += snap.figures.ranges;
        // A percentage the driver could not resolve (an injected failure) leaves no limit.
        let limit = pool.limit(dev);
        let expected = m.setup.limit.resolve(m.setup.capacity);
        let unresolved = matches!(m.setup.limit, DeviceBytes::Fraction(_)) && limit == u64::MAX;
        if reserved > limit || (limit != expected && !unresolved) {
            return fail(format!(
                "device {dev}: reserved {reserved} with the limit {limit} (configured {expected})"
            ));
        }
        // What the pool could give back now is everything its live blocks do not hold (free
        // blocks thread caches keep count: they come back first); the rest of the cache is
        // stranded beside live blocks.
        let f = &snap.figures;
        let releasable = reserved - live_held[dev as usize];
        if f.releasable != releasable || f.releasable + f.stranded != snap.cached {
            return fail(format!(
                "device {dev}: figures say releasable {} stranded {} of cached {}; the live \
                 blocks leave {releasable} releasable",
                f.releasable, f.stranded, snap.cached
            ));
        }
        if snap.cached != reserved - allocated || snap.pending > snap.cached {
            return fail(format!(
                "device {dev}: cached {} pending {} with reserved {reserved} allocated {allocated}",
                snap.cached, snap.pending
            ));
        }
    }
    if ranges != driver.model.reservations() as u64 {
        return fail(format!(
            "the pools have {ranges} expandable segments, the driver {} reserved ranges",
            driver.model.reservations()
        ));
    }
    if let Some((dev, released)) = release {
        let refused = delivered.iter().any(|d| d.0 == Call::Free);
        let fence_failed = delivered.iter().any(|d| d.0 == Call::Fence);
        let Some(snap) = pool.device_stats(dev) else {
            return Ok(());
        };
        let mappings = driver.with(|s| s.mappings.clone());
        // Granules go only after a fence; at an allocation's threshold the pool takes none for
        // pending blocks (empty-cache and a program synchronization do), so the granules those
        // touch may stay.
        let granules_go = !fence_failed && (released != Released::Threshold || snap.pending == 0);
        let keep = if released == Released::All {
            0
        } else {
            snap.threshold
        };
        if !refused && snap.cached > keep {
            for (&s, seg) in segments.iter().filter(|(_, seg)| seg.device == dev) {
                let (slen, granule) = (seg.bytes, mappings.contains_key(&s));
                if touched(m, s, slen) || (granule && !granules_go) {
                    continue;
                }
                let what = if granule { "granule" } else { "segment" };
                return fail(format!(
                    "device {dev}: cached {} above {keep}, yet {what} {s:#x}+{slen} holds no \
                     live block (pending {})",
                    snap.cached, snap.pending
                ));
            }
        }
    }
    Ok(())
}
