//! Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, ...): the
//! reserved ranges, the physical allocations (handles) and the mappings between them, backed
//! by real host memory (see `os.rs`).
//!
//! Invariants: a mapping lies inside one reservation and covers one whole handle; mappings
//! never overlap; a handle lives while it is not released or still mapped
//! (`!released || maps > 0`). Device figures (capacity, statistics) are the caller's: this
//! module says what changed, the state accounts for it.

mod os;

pub use os::Prot;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;

/// `cuMemGetAllocationGranularity`'s answer, minimum and recommended alike: sizes, offsets
/// and alignments are multiples of it.
pub const GRANULARITY: usize = 2 << 20;

/// Why an access to a range is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Some byte of it is not mapped.
    Unmapped,
    /// It is mapped, but the device was not given that access (`cuMemSetAccess`).
    NoAccess,
}

/// A physical allocation (`CUmemGenericAllocationHandle`).
pub struct Handle {
    pub device: usize,
    pub size: usize,
    fd: OwnedFd,
    /// `cuMemRelease` was called: the handle is gone for the caller, the memory stays until
    /// its last mapping goes.
    pub released: bool,
    /// How many mappings show it.
    pub maps: u32,
}

/// A handle mapped at `[base, base + size)`.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    pub base: usize,
    pub size: usize,
    pub handle: u64,
    /// The handle's device (where the physical memory is).
    pub device: usize,
    /// Bit `d`: device `d` may read (`readers`) or write (`writers`); every mapping starts
    /// with no access, as in CUDA.
    readers: u128,
    writers: u128,
}

impl Mapping {
    pub fn end(&self) -> usize {
        self.base + self.size
    }

    /// What the host may do: the widest access of any device (device pointers are host
    /// pointers, so the host stands for every device).
    fn prot(&self) -> Prot {
        if self.writers != 0 {
            Prot::ReadWrite
        } else if self.readers != 0 {
            Prot::Read
        } else {
            Prot::None
        }
    }

    fn allows(&self, device: usize, write: bool) -> bool {
        let mask = if write { self.writers } else { self.readers };
        mask & (1 << device) != 0
    }
}

/// What `unmap` did to one mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unmapped {
    pub device: usize,
    pub size: usize,
    /// Its handle was released and this was its last mapping: the physical memory is gone.
    pub freed: bool,
}

#[derive(Default)]
pub struct Vmm {
    /// Reserved ranges: base → size.
    reservations: BTreeMap<usize, usize>,
    handles: HashMap<u64, Handle>,
    /// Mappings by base address.
    mappings: BTreeMap<usize, Mapping>,
    /// Handle values are never reused, so a stale one is always refused.
    last_handle: u64,
}

/// Whether `n` is a positive multiple of the granularity.
pub fn granular(n: usize) -> bool {
    n > 0 && n.is_multiple_of(GRANULARITY)
}

impl Vmm {
    /// Reserves `size` bytes aligned to `align` (0: the granularity); `None` when either is
    /// not a granularity multiple (or `align` not a power of two) or there is no room.
    pub fn reserve(&mut self, size: usize, align: usize) -> Option<usize> {
        let align = if align == 0 { GRANULARITY } else { align };
        if !granular(size) || !granular(align) || !align.is_power_of_two() {
            return None;
        }
        let base = os::reserve(size, align)?;
        self.reservations.insert(base, size);
        Some(base)
    }

    /// Frees the reservation `[base, base + size)`; false unless it is exactly one and holds
    /// no mapping (the simulator's stricter reading: unmap first).
    pub fn unreserve(&mut self, base: usize, size: usize) -> bool {
        if self.reservations.get(&base) != Some(&size)
            || self.mappings.range(base..base + size).next().is_some()
        {
            return false;
        }
        self.reservations.remove(&base);
        // SAFETY: an exact reservation of ours, with no mapping left in it.
        unsafe { os::unreserve(base, size) };
        true
    }

    /// Whether `addr` lies in reserved address space (mapped or not).
    pub fn reserved(&self, addr: usize) -> bool {
        self.reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&b, &s)| addr < b + s)
    }

    /// Makes `size` (a granularity multiple) bytes of physical memory for `device`; `None`
    /// if the host cannot. Capacity is the caller's to check.
    pub fn create(&mut self, device: usize, size: usize) -> Option<u64> {
        let fd = os::create(size)?;
        self.last_handle += 1;
        let handle = Handle {
            device,
            size,
            fd,
            released: false,
            maps: 0,
        };
        self.handles.insert(self.last_handle, handle);
        Some(self.last_handle)
    }

    /// A handle the caller still holds (not released).
    pub fn handle(&self, id: u64) -> Option<&Handle> {
        self.handles.get(&id).filter(|h| !h.released)
    }

    /// `cuMemRelease`: `None` for a handle not held; else whether the memory is gone now
    /// (not mapped) rather than at its last unmap.
    pub fn release(&mut self, id: u64) -> Option<bool> {
        let h = self.handles.get_mut(&id).filter(|h| !h.released)?;
        h.released = true;
        let gone = h.maps == 0;
        if gone {
            self.handles.remove(&id);
        }
        Some(gone)
    }

    /// In a forked child: every mapping becomes private, so that nothing the child writes
    /// reaches its parent's memory. A GPU's memory is no forked child's to touch; the
    /// simulator's is a memfd the two would otherwise share. Private is not a snapshot: a page
    /// the child has not written still shows what the parent stores later, and two mappings of
    /// one handle no longer show each other's writes in the child. A handle the child maps
    /// again is shared with the parent once more; the child's runtime never does that.
    pub fn privatize_after_fork(&self) {
        for m in self.mappings.values() {
            if let Some(h) = self.handles.get(&m.handle) {
                // SAFETY: `m` is a mapping of `h`'s memfd made by `os::map`.
                let done = unsafe { os::privatize(m.base, m.size, &h.fd, m.prot()) };
                debug_assert!(done, "privatize {:#x}+{:#x}", m.base, m.size);
            }
        }
    }

    /// Maps the whole handle `id` at `base` (its size must be `size`), with no access yet;
    /// the handle's device, or `None` if the range is not free reserved space at a granule.
    pub fn map(&mut self, base: usize, size: usize, id: u64) -> Option<usize> {
        let h = self
            .handles
            .get(&id)
            .filter(|h| !h.released && h.size == size)?;
        let end = base.checked_add(size)?;
        let (&r_base, &r_size) = self.reservations.range(..=base).next_back()?;
        let inside = end <= r_base + r_size && (base - r_base).is_multiple_of(GRANULARITY);
        let before_free = self
            .mappings
            .range(..end)
            .next_back()
            .is_none_or(|(_, m)| m.end() <= base);
        // SAFETY: checked just above: inside one reservation, over no mapping of ours.
        if !inside || !before_free || !unsafe { os::map(base, size, &h.fd, Prot::None) } {
            return None;
        }
        let device = h.device;
        self.handles.get_mut(&id)?.maps += 1;
        let m = Mapping {
            base,
            size,
            handle: id,
            device,
            readers: 0,
            writers: 0,
        };
        self.mappings.insert(base, m);
        Some(device)
    }

    /// The bases of the mappings that exactly tile the whole mappings of `[base, end)`
    /// (holes allowed): `None` if the range cuts a mapping or holds none.
    fn whole_mappings(&self, base: usize, size: usize) -> Option<Vec<usize>> {
        let end = base.checked_add(size)?;
        let cut_at_start = self.containing(base).is_some_and(|m| m.base != base);
        let inside: Vec<&Mapping> = self.mappings.range(base..end).map(|(_, m)| m).collect();
        if cut_at_start || inside.is_empty() || inside.iter().any(|m| m.end() > end) {
            return None;
        }
        Some(inside.iter().map(|m| m.base).collect())
    }

    /// `cuMemUnmap`: removes the whole mappings in `[base, base + size)` (none may be cut),
    /// leaving the space reserved and inaccessible; `None` if the range is refused.
    pub fn unmap(&mut self, base: usize, size: usize) -> Option<Vec<Unmapped>> {
        let bases = self.whole_mappings(base, size)?;
        let mut done = Vec::with_capacity(bases.len());
        for b in bases {
            let m = self.mappings.remove(&b)?;
            // SAFETY: a mapping of ours, now forgotten; the caller accepts that any later
            // access faults.
            unsafe { os::unmap(m.base, m.size) };
            let h = self.handles.get_mut(&m.handle)?;
            h.maps -= 1;
            let freed = h.released && h.maps == 0;
            if freed {
                self.handles.remove(&m.handle);
            }
            done.push(Unmapped {
                device: m.device,
                size: m.size,
                freed,
            });
        }
        Some(done)
    }

    /// `cuMemSetAccess` for `device`: the whole mappings that tile `[base, base + size)`
    /// without holes get `prot`; false if the range is refused (nothing changes).
    pub fn set_access(&mut self, base: usize, size: usize, device: usize, prot: Prot) -> bool {
        if self.cover(base, size).is_err() {
            return false;
        }
        let Some(bases) = self.whole_mappings(base, size) else {
            return false;
        };
        let bit = 1u128 << device;
        for b in bases {
            let Some(m) = self.mappings.get_mut(&b) else {
                continue;
            };
            m.readers &= !bit;
            m.writers &= !bit;
            if prot != Prot::None {
                m.readers |= bit;
            }
            if prot == Prot::ReadWrite {
                m.writers |= bit;
            }
            // SAFETY: a mapping of ours.
            unsafe { os::protect(m.base, m.size, m.prot()) };
        }
        true
    }

    /// The mapping that contains `addr`.
    pub fn containing(&self, addr: usize) -> Option<&Mapping> {
        self.mappings
            .range(..=addr)
            .next_back()
            .map(|(_, m)| m)
            .filter(|m| addr < m.end())
    }

    /// The mappings that cover `[addr, addr + len)` (`len` > 0) end to end, in order.
    fn cover(&self, addr: usize, len: usize) -> Result<Vec<&Mapping>, Refusal> {
        let end = addr.checked_add(len).ok_or(Refusal::Unmapped)?;
        let mut at = addr;
        let mut out = Vec::new();
        while at < end {
            let m = self.containing(at).ok_or(Refusal::Unmapped)?;
            at = m.end();
            out.push(m);
        }
        Ok(out)
    }

    /// Whether `device` may read (or, with `write`, write) all of `[addr, addr + len)`; a
    /// range may span adjacent mappings.
    pub fn check(
        &self,
        addr: usize,
        len: usize,
        device: usize,
        write: bool,
    ) -> Result<(), Refusal> {
        let cover = self.cover(addr, len)?;
        if cover.iter().all(|m| m.allows(device, write)) {
            Ok(())
        } else {
            Err(Refusal::NoAccess)
        }
    }

    /// Whether the host can write all of `[addr, addr + len)` now (a kernel's fill lands
    /// only there).
    pub fn writable(&self, addr: usize, len: usize) -> bool {
        self.cover(addr, len)
            .is_ok_and(|c| c.iter().all(|m| m.prot() == Prot::ReadWrite))
    }

    /// Physical allocations of device `d` still alive (released ones kept by a mapping too).
    pub fn handles_of(&self, d: usize) -> u64 {
        self.handles.values().filter(|h| h.device == d).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: usize = GRANULARITY;

    #[test]
    fn one_handle_two_mappings_share_bytes() {
        let mut v = Vmm::default();
        let r = v.reserve(4 * G, 0).unwrap();
        assert_eq!(r % G, 0);
        let h = v.create(0, G).unwrap();
        assert_eq!(v.map(r, G, h), Some(0));
        assert_eq!(v.map(r + 2 * G, G, h), Some(0));
        assert!(v.set_access(r, G, 0, Prot::ReadWrite));
        assert!(v.set_access(r + 2 * G, G, 0, Prot::Read));
        // SAFETY: both ranges are mapped, the first writable and the second readable.
        unsafe {
            *((r + 10) as *mut u8) = 7;
            assert_eq!(*((r + 2 * G + 10) as *const u8), 7);
        }
        assert_eq!(v.check(r, G, 0, true), Ok(()));
        assert_eq!(v.check(r + 2 * G, 8, 0, true), Err(Refusal::NoAccess));
        assert_eq!(v.check(r + G, 8, 0, false), Err(Refusal::Unmapped));
        assert_eq!(v.check(r, 8, 1, false), Err(Refusal::NoAccess));
    }

    #[test]
    fn unmap_takes_whole_mappings_and_release_waits_for_it() {
        let mut v = Vmm::default();
        let r = v.reserve(4 * G, 4 * G).unwrap();
        assert_eq!(r % (4 * G), 0);
        let a = v.create(0, G).unwrap();
        let b = v.create(0, 2 * G).unwrap();
        assert_eq!(v.map(r, G, a), Some(0));
        assert_eq!(v.map(r + G, G, b), None, "part of a handle");
        assert_eq!(v.map(r + G, 2 * G, b), Some(0));
        assert_eq!(v.map(r + 2 * G, G, a), None, "over a mapping");
        assert!(v.set_access(r, 3 * G, 0, Prot::ReadWrite));
        assert_eq!(
            v.check(r + G - 4, 8, 0, true),
            Ok(()),
            "across two mappings"
        );
        assert!(!v.unreserve(r, 4 * G), "mappings inside");
        assert_eq!(v.release(a), Some(false));
        assert_eq!(v.release(a), None);
        assert!(v.unmap(r, 2 * G).is_none(), "cuts the second mapping");
        assert!(v.unmap(r + G, G).is_none(), "part of one mapping");
        let done = v.unmap(r, 3 * G).unwrap();
        let freed: Vec<bool> = done.iter().map(|u| u.freed).collect();
        assert_eq!(freed, vec![true, false]);
        assert!(v.handle(b).is_some());
        assert_eq!(v.release(b), Some(true));
        assert!(v.unreserve(r, 4 * G));
        assert!(!v.reserved(r));
    }

    /// A forked child's mapping becomes private even where it is larger than the machine's
    /// memory: a simulated device's memory costs nothing until touched, and a private writable
    /// mapping charged in full would be refused, leaving the child writing into its parent's.
    #[test]
    fn a_privatized_mapping_larger_than_memory_keeps_writes_to_itself() {
        let size = 1usize << 40;
        let mut v = Vmm::default();
        let r = v.reserve(size, 0).unwrap();
        let h = v.create(0, size).unwrap();
        assert_eq!(v.map(r, size, h), Some(0));
        assert!(v.set_access(r, size, 0, Prot::ReadWrite));
        v.privatize_after_fork();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&v.handles[&h].fd);
        let mut byte = 0u8;
        // SAFETY: the range is mapped writable; `byte` is a one-byte buffer.
        let read = unsafe {
            *((r + 10) as *mut u8) = 7;
            libc::pread(fd, (&mut byte as *mut u8).cast(), 1, 10)
        };
        assert_eq!(read, 1);
        assert_eq!(byte, 0, "the write reached the memfd the parent shares");
        assert_eq!(v.unmap(r, size).map(|u| u.len()), Some(1));
        assert_eq!(v.release(h), Some(true));
        assert!(v.unreserve(r, size));
    }

    #[test]
    fn sizes_must_be_granular() {
        let mut v = Vmm::default();
        assert_eq!(v.reserve(G + 4096, 0), None);
        assert_eq!(v.reserve(G, 3 * G), None);
        assert_eq!(v.reserve(0, 0), None);
    }
}
