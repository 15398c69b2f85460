//! The hit path. BUDGET PLACEHOLDER

use super::*;

impl<B: Backend> Pool<B> {
    /// A cached allocation of `size` bytes on `device` for use on `stream`: the block waiting in
    /// the exact-size bin of its size, under the device's lock, with no CUDA call (the device
    /// need not even be current). `None`, with nothing changed, when `alloc_on` would serve the
    /// request another way: a thread cache, a block held for the stream, a pending block that
    /// became reusable, a fit or a new segment, or a release threshold to apply.
    #[inline(always)]
    pub fn alloc_hit(&self, device: u32, size: u64, stream: Option<StreamKey>) -> Option<Addr> {
        let slot = self.existing(device)?;
        if slot.flags.enabled.load(Ordering::Relaxed) || slot.flags.any.load(Ordering::Relaxed) {
            return None;
        }
        // A lock found taken goes the general way, which counts the wait.
        let mut p = slot.pool.try_lock()?;
        if p.threshold != u64::MAX {
            return None;
        }
        let addr = p.alloc_hit(size, stream, &self.timed(slot), &slot.seqs)?;
        // As `lock_to_allocate` counts a lock taken without waiting.
        if slot.flags.multi() {
            p.contention
                .took(None, slot.backend_ns.load(Ordering::Relaxed));
        }
        self.allocated_under_lock(slot, &mut p);
        Some(addr)
    }
}
