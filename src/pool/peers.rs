//! The pool's side of peer access and of the program's queries about its memory: which devices
//! reach a device's expandable segments (`cudaDeviceEnablePeerAccess`), and the mapped run
//! around an address (`cuMemGetAddressRange`, IPC). The hooks' side is `dispatch::peer`.

use super::*;

/// The devices given access to one device's mapped memory. Kept by `Pool` for every device, so
/// that a peer enabled before the device's pool exists is not lost; the device's pool reads it
/// under its lock each time it maps.
#[derive(Debug, Default)]
pub struct PeerSet(AtomicU64);

impl PeerSet {
    pub fn get(&self) -> DeviceSet {
        DeviceSet(self.0.load(Ordering::Acquire))
    }

    /// Adds `device`; whether it was not there.
    fn add(&self, device: u32) -> bool {
        let bit = DeviceSet::one(device).0;
        self.0.fetch_or(bit, Ordering::AcqRel) & bit == 0
    }

    /// Drops `device`: the driver refused it a grant.
    pub(super) fn remove(&self, device: u32) {
        self.0
            .fetch_and(!DeviceSet::one(device).0, Ordering::AcqRel);
    }
}

/// Why an IPC handle of the pool's memory is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpcRefusal {
    /// A block of an expandable segment: CUDA virtual memory, which no IPC handle names.
    Mapped,
    /// A block inside a classic segment, not at its start: the handle would name the segment.
    InsideSegment,
    /// Freed memory the pool caches: no block of the program's, which CUDA refuses a handle
    /// as the pool does. Neither counted nor reported.
    Freed,
}

/// IPC handles refused on the pool's memory, by reason (for the summary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpcRefusals {
    pub mapped: u64,
    pub inside_segment: u64,
}

/// `IpcRefusals`, counted as they happen.
#[derive(Debug, Default)]
pub struct IpcCounts {
    mapped: AtomicU64,
    inside_segment: AtomicU64,
}

impl<B: Backend> Pool<B> {
    /// The program let `peer` reach `owner`'s memory (`cudaDeviceEnablePeerAccess(owner)` with
    /// `peer` current): the granules `owner`'s pool has mapped get the access now, and its later
    /// mappings with it. A refusal drops the peer again and is the caller's to report: the
    /// program's kernels on `peer` would fault on `owner`'s mapped blocks.
    pub fn add_peer(&self, owner: u32, peer: u32) -> Result<(), CudaError> {
        if owner == peer || !self.serves(owner) || !self.serves(peer) {
            return Ok(());
        }
        let set = &self.peers[owner as usize];
        // Added under the owner's lock, so that a second caller finds the peer only once its
        // grant is made.
        let Some(slot) = self.existing(owner) else {
            set.add(peer);
            // A pool made meanwhile may have mapped before it read the set: granted again.
            return match self.existing(owner) {
                Some(slot) => self.grant_to(slot, Self::lock(slot), set, peer),
                None => Ok(()),
            };
        };
        let p = Self::lock(slot);
        if !set.add(peer) {
            return Ok(());
        }
        self.grant_to(slot, p, set, peer)
    }

    /// Give `peer` access to what `slot`'s pool, locked in `p`, mapped; a refusal drops it.
    fn grant_to(
        &self,
        slot: &DeviceSlot,
        mut p: MutexGuard<'_, DevicePool>,
        set: &PeerSet,
        peer: u32,
    ) -> Result<(), CudaError> {
        let granted = p.grant_mapped(DeviceSet::one(peer), &self.timed(slot));
        if granted.is_err() {
            set.remove(peer);
        }
        granted.map(drop)
    }

    /// `device` is in use (the program allocated there or made it current): it and the devices
    /// in use before it reach each other's mapped memory. A program copies with any device
    /// current, and that works on `cudaMalloc` memory whether or not it enabled peer access. A
    /// device that cannot reach another keeps classic segments (`Backend::vmm_peers`); a grant
    /// the driver refuses drops the pair (`add_peer`). One load when it was in use:
    /// the device is marked only once its grants are made, so that another thread that finds
    /// it marked may copy at once.
    #[inline(always)]
    pub fn note_device_in_use(&self, device: u32) {
        // The bit first: the test every allocation of a device in use makes, in a few
        // instructions (a device beyond the set has no bit and goes on, to be turned away).
        let bit = 1u64.checked_shl(device).unwrap_or(0);
        if self.in_use.load(Ordering::Acquire) & bit == 0 {
            self.note_new_device_in_use(device);
        }
    }

    /// `note_device_in_use` of a device not marked in use.
    #[cold]
    #[inline(never)]
    fn note_new_device_in_use(&self, device: u32) {
        let wanted = self.settings.expandable && self.serves(device);
        let Some(bit) = 1u64.checked_shl(device).filter(|_| wanted) else {
            return;
        };
        // Devices noted at once see each other: one at a time.
        let _one = self.noting.lock();
        let before = DeviceSet(self.in_use.load(Ordering::Acquire));
        if before.contains(device) {
            return;
        }
        // Asked of every pair: the driver may not be loaded yet to say which can reach which.
        for other in before.iter() {
            let _ = self.add_peer(other, device);
            let _ = self.add_peer(device, other);
        }
        self.in_use.fetch_or(bit, Ordering::Release);
    }

    /// The devices given access to `owner`'s mapped memory.
    pub fn peers_of(&self, owner: u32) -> DeviceSet {
        self.peers
            .get(owner as usize)
            .map_or(DeviceSet::default(), |s| s.get())
    }

    /// The run of mapped granules around `addr` when it lies in an expandable segment, as
    /// (base, size): CUDA virtual memory, which the driver reports one mapping at a time and
    /// IPC handles cannot name.
    pub fn mapped_run(&self, addr: Addr) -> Option<(Addr, u64)> {
        (0..MAX_DEVICES as u32).find_map(|d| Self::lock(self.existing(d)?).mapped_run_at(addr))
    }

    /// Why an IPC handle of `addr` would not name the program's block, if it would not. `None`
    /// for memory that is not the pool's, and for a block that starts a classic segment.
    pub fn ipc_refusal(&self, addr: Addr) -> Option<IpcRefusal> {
        let live = self.live_block(addr);
        let held = live.is_some() || self.inside_held_block(addr);
        if self.mapped_run(addr).is_some() {
            return Some(if held {
                IpcRefusal::Mapped
            } else {
                IpcRefusal::Freed
            });
        }
        match live {
            Some((_, b)) => (b.addr != b.segment_addr).then_some(IpcRefusal::InsideSegment),
            None if held => Some(IpcRefusal::InsideSegment),
            None => self.owner_of(addr).map(|_| IpcRefusal::Freed),
        }
    }

    /// Whether `addr` lies past the start of a block of the program's on some device.
    fn inside_held_block(&self, addr: Addr) -> bool {
        (0..MAX_DEVICES as u32).any(|d| {
            self.existing(d)
                .is_some_and(|s| Self::lock(s).inside_held_block(addr))
        })
    }

    /// An IPC handle was refused for `why`: counted for the summary, but for freed memory.
    pub fn note_ipc_refused(&self, why: IpcRefusal) {
        let n = match why {
            IpcRefusal::Mapped => &self.ipc.mapped,
            IpcRefusal::InsideSegment => &self.ipc.inside_segment,
            IpcRefusal::Freed => return,
        };
        n.fetch_add(1, Ordering::Relaxed);
    }

    pub fn ipc_refusals(&self) -> IpcRefusals {
        IpcRefusals {
            mapped: self.ipc.mapped.load(Ordering::Relaxed),
            inside_segment: self.ipc.inside_segment.load(Ordering::Relaxed),
        }
    }
}
