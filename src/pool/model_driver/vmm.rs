//! The model driver's virtual memory: address ranges reserved without memory, memory mapped
//! into them and unmapped again, and the access each mapping was given. The `Backend`'s
//! `vmm_*` calls (`mod.rs`) deliver armed failures, then come here.

use super::{ModelDriver, Segment, State, SEGMENT_ALIGNMENT};
use crate::pool::backend::{Addr, CudaError, DeviceSet};

impl ModelDriver {
    /// Reserve `bytes` of address space on `device` (`cuMemAddressReserve`): no memory, no
    /// capacity taken. Aligned to `SEGMENT_ALIGNMENT`, with the gap after it.
    pub fn reserve(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let mut s = self.lock();
        let next = bytes
            .checked_next_multiple_of(SEGMENT_ALIGNMENT)
            .and_then(|span| span.checked_add(s.gap))
            .and_then(|span| s.next.checked_add(span))
            .filter(|_| bytes > 0)
            .ok_or(CudaError::INVALID_VALUE)?;
        let addr = s.next;
        s.next = next;
        s.ranges.insert(addr, Segment { device, bytes });
        Ok(addr)
    }

    /// Map `bytes` of new memory at `addr`, inside a reserved range and over nothing mapped
    /// (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`): out of memory beyond the capacity.
    pub fn map(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        let mut s = self.lock();
        s.counts.maps += 1;
        let end = addr.checked_add(bytes).ok_or(CudaError::INVALID_VALUE)?;
        let in_range = s
            .ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, r)| r.device == device && end <= base + r.bytes);
        let free = s
            .segments
            .range(..end)
            .next_back()
            .is_none_or(|(&a, seg)| a + seg.bytes <= addr);
        if !in_range || !free || bytes == 0 {
            s.misuses.push(format!(
                "mapped {addr:#x}+{bytes} outside a reservation or over a mapping"
            ));
            return Err(CudaError::INVALID_VALUE);
        }
        if s.reserved(device).saturating_add(bytes) > s.capacity {
            s.counts.refused += 1;
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        s.segments.insert(addr, Segment { device, bytes });
        *s.reserved_on.entry(device).or_default() += bytes;
        s.counts.reserved += bytes;
        s.counts.peak_reserved = s.counts.peak_reserved.max(s.counts.reserved);
        Ok(())
    }

    /// Unmap the mapping at `addr` and release its memory (`cuMemUnmap`, `cuMemRelease`): a
    /// whole mapping only. Its bytes.
    pub fn unmap(&self, device: u32, addr: Addr) -> Result<u64, CudaError> {
        let mut s = self.lock();
        s.counts.unmaps += 1;
        let mapped = s
            .ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(&b, r)| addr - b < r.bytes);
        let Some(seg) = s
            .segments
            .get(&addr)
            .copied()
            .filter(|g| mapped && g.device == device)
        else {
            s.misuses.push(format!("unmapped {addr:#x}, not a mapping"));
            return Err(CudaError::INVALID_VALUE);
        };
        s.segments.remove(&addr);
        s.access.remove(&addr);
        s.no_access.remove(&addr);
        *s.reserved_on.entry(device).or_default() -= seg.bytes;
        s.counts.reserved -= seg.bytes;
        Ok(seg.bytes)
    }

    /// Address ranges reserved and not freed.
    pub fn reservations(&self) -> usize {
        self.lock().ranges.len()
    }

    /// The peers `vmm_grant` gave access to the mapping that holds `addr` (none outside one).
    pub fn peers_at(&self, addr: Addr) -> DeviceSet {
        let s = self.lock();
        match s.segments.range(..=addr).next_back() {
            Some((&base, seg)) if addr - base < seg.bytes => {
                s.access.get(&base).copied().unwrap_or_default()
            }
            _ => DeviceSet::default(),
        }
    }

    /// Whether `[addr, end)` lies in mappings of `device`'s reserved ranges that follow one
    /// another without a hole, each with access for `device` and for `peers`: memory a block
    /// handed out there may use.
    pub fn usable(&self, device: u32, addr: Addr, end: Addr, peers: DeviceSet) -> bool {
        let s = self.lock();
        let mut at = addr;
        while at < end {
            match s.segments.range(..=at).next_back() {
                Some((&base, seg))
                    if at - base < seg.bytes
                        && seg.device == device
                        && s.in_reservation(base)
                        && !s.no_access.contains(&base)
                        && s.access.get(&base).copied().unwrap_or_default() & peers == peers =>
                {
                    at = base + seg.bytes
                }
                _ => return false,
            }
        }
        true
    }

    /// The peers the pool dropped after the driver refused them a grant, as it told the backend
    /// (`vmm_peer_dropped`): device, peer, error.
    pub fn peers_dropped(&self) -> Vec<(u32, u32, CudaError)> {
        self.lock().peers_dropped.clone()
    }

    /// Bytes mapped into reserved ranges of `device` now (segments not counted).
    pub fn mapped_on(&self, device: u32) -> u64 {
        let s = self.lock();
        s.segments
            .iter()
            .filter(|&(&a, seg)| seg.device == device && s.in_reservation(a))
            .map(|(_, seg)| seg.bytes)
            .sum()
    }
}

impl State {
    /// Whether `addr` lies in a reserved range.
    pub(super) fn in_reservation(&self, addr: Addr) -> bool {
        self.ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(&b, r)| addr - b < r.bytes)
    }

    /// The whole mappings of `device` that tile `[addr, addr + bytes)`, as `cuMemSetAccess`
    /// takes them, by base; none if they do not.
    pub(super) fn whole_mappings(&self, device: u32, addr: Addr, bytes: u64) -> Vec<Addr> {
        let (end, mut at, mut bases) = (addr.saturating_add(bytes), addr, Vec::new());
        while at < end {
            match self.segments.get(&at) {
                Some(seg) if seg.device == device && self.in_reservation(at) => {
                    bases.push(at);
                    at += seg.bytes;
                }
                _ => break,
            }
        }
        if bytes == 0 || at != end {
            bases.clear();
        }
        bases
    }
}
