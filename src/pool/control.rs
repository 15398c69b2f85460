//! The program's settings at run time: release threshold, limit, empty-cache, device reset.

use super::*;

impl<B: Backend> Pool<B> {
    /// The threshold `device` starts with: one set at run time, or the configured one.
    pub(super) fn initial_threshold(&self, device: u32) -> u64 {
        self.threshold_set_for(device)
            .unwrap_or_else(|| self.resolve(self.settings.threshold, device))
    }

    /// The threshold set at run time for `device`: for it alone, else for every device.
    fn threshold_set_for(&self, device: u32) -> Option<u64> {
        let own = self.device_threshold[device as usize].load(Ordering::SeqCst);
        decode_threshold(own)
            .or_else(|| decode_threshold(self.threshold_override.load(Ordering::SeqCst)))
    }

    /// Whether `device`'s threshold is one the program set on CUDA's default memory pool,
    /// which bounds the reserved bytes (`DevicePool::cache_allowance`).
    pub(super) fn threshold_from_program(&self, device: u32) -> bool {
        let own = self.device_threshold[device as usize].load(Ordering::SeqCst);
        let program = self.program_threshold.load(Ordering::SeqCst);
        decode_threshold(own).is_some() && device_bit(device).is_some_and(|bit| program & bit != 0)
    }

    /// A slot just published: a threshold set at run time while it was being made applies.
    pub(super) fn settle_threshold(&self, device: u32, slot: &DeviceSlot) {
        if let Some(t) = self.threshold_set_for(device) {
            let program = self.threshold_from_program(device);
            let mut p = Self::lock(slot);
            if p.threshold != t || p.threshold_bounds_reserved != program {
                p.set_threshold(t, program);
                self.update_caches(slot, &mut p);
            }
        }
    }

    /// `amount` in bytes on `device` (a fraction asks the driver for the device's size; no
    /// answer, no bound).
    pub(super) fn resolve(&self, amount: DeviceBytes, device: u32) -> u64 {
        match amount {
            DeviceBytes::Fraction(_) => match self.backend.memory_info(device) {
                Ok((_, total)) => amount.resolve(total),
                Err(_) => u64::MAX,
            },
            a => a.resolve(0),
        }
    }

    /// The most bytes the pool reserves on `device` (`u64::MAX`: no limit).
    pub fn limit(&self, device: u32) -> u64 {
        match self.existing(device) {
            Some(slot) => Self::lock(slot).limit,
            None => usable_limit(self.resolve(self.settings.limit, device)),
        }
    }

    /// A request `device` answered with out-of-memory, that CUDA then served on its own try
    /// (memory was freed in between): recovered, not an out-of-memory the program saw.
    pub fn recovered_by_cuda(&self, device: u32) {
        if let Some(slot) = self.existing(device) {
            let s = &mut Self::lock(slot).stats;
            if s.ooms > 0 {
                s.ooms -= 1;
                s.oom_recovered += 1;
            }
        }
    }

    /// An out-of-memory returned to the program on `device` was a probe of all the free memory
    /// (`dispatch::after_oom`).
    pub fn refused_probe(&self, device: u32) {
        if let Some(slot) = self.existing(device) {
            Self::lock(slot).stats.oom_probes += 1;
        }
    }

    /// Release every whole free segment of `device`. Returns the bytes released.
    pub fn empty_cache(&self, device: u32) -> u64 {
        self.trim_to(device, 0)
    }

    /// Release whole free segments of `device` until at most `keep` bytes stay reserved.
    /// Returns the bytes released.
    pub fn trim_to(&self, device: u32, keep: u64) -> u64 {
        self.with_cache(device, |p, backend, clock| p.trim_to(backend, clock, keep))
    }

    /// Give `device`'s whole cache back because an allocation the pool does not serve ran out
    /// of memory (`DevicePool::release_for_others`). Returns the bytes released.
    pub fn release_for_others(&self, device: u32) -> u64 {
        self.with_cache(device, |p, backend, clock| {
            p.release_for_others(backend, clock)
        })
    }

    /// `release` on `device`'s pool, its thread caches' blocks taken back first; 0 for a
    /// device the pool has not used.
    fn with_cache(
        &self,
        device: u32,
        release: impl FnOnce(&mut DevicePool, &dyn Backend, &ReuseClock) -> u64,
    ) -> u64 {
        let Some(slot) = self.existing(device) else {
            return 0;
        };
        let mut p = Self::lock(slot);
        Self::take_back_cached_blocks(slot, &mut p);
        release(&mut p, &self.timed(slot), &slot.clock)
    }

    /// Start every figure's peak of `device` over again from its current value.
    pub fn reset_peaks(&self, device: u32) {
        if let Some(slot) = self.existing(device) {
            let mut p = Self::lock(slot);
            Self::take_back_cached_blocks(slot, &mut p);
            let s = &mut p.stats;
            for g in [
                &mut s.requested,
                &mut s.allocated,
                &mut s.reserved,
                &mut s.blocks,
                &mut s.segments,
            ] {
                g.reset_peak();
            }
        }
    }

    /// Start a new peak of `device`'s reserved bytes (`reserved`), or of its allocated bytes,
    /// from the current value; the run's peak stays in the summary.
    pub fn reset_peak(&self, device: u32, reserved: bool) {
        if let Some(slot) = self.existing(device) {
            let mut p = Self::lock(slot);
            Self::take_back_cached_blocks(slot, &mut p);
            match reserved {
                true => p.stats.reserved.reset_peak(),
                false => p.stats.allocated.reset_peak(),
            }
        }
    }

    /// The free blocks thread caches hold, exited threads' too, back in the device: before a
    /// trim, a figure of what could be given back, or a peak restarted from the current value
    /// (the device counts them as allocated, so a peak restarted with them out would read above
    /// the allocated bytes reported right after, which leave them out).
    pub(super) fn take_back_cached_blocks(slot: &DeviceSlot, p: &mut DevicePool) {
        slot.caches.sweep_orphans(p, &slot.clock);
        slot.caches.reclaim(p, &slot.clock);
    }

    /// The user sets the release threshold of every device, now and for devices not yet used.
    pub fn set_threshold(&self, bytes: u64) {
        self.user_threshold.store(u64::MAX, Ordering::SeqCst);
        self.program_threshold.store(0, Ordering::SeqCst);
        // The latest call wins: one for every device replaces those for one.
        for t in &self.device_threshold {
            t.store(NO_OVERRIDE, Ordering::SeqCst);
        }
        self.threshold_override
            .store(encode_threshold(bytes), Ordering::SeqCst);
        for d in 0..MAX_DEVICES as u32 {
            self.apply_threshold(d, bytes, false);
        }
    }

    /// The user sets the release threshold of `device` alone. A device not used yet starts with
    /// it: no pool is made for it, so no CUDA call is made about it. Returns false for a device
    /// the pool does not serve.
    pub fn set_device_threshold(&self, device: u32, bytes: u64) -> bool {
        let Some(bit) = device_bit(device) else {
            return false;
        };
        self.user_threshold.fetch_or(bit, Ordering::SeqCst);
        self.program_threshold.fetch_and(!bit, Ordering::SeqCst);
        self.store_device_threshold(device, bytes, false);
        true
    }

    /// The program set `device`'s threshold through CUDA (its default memory pool's release
    /// threshold): it becomes the pool's unless the user set one at run time, with CUDA's
    /// meaning (the reserved bytes to keep). Returns whether it did.
    pub fn adopt_program_threshold(&self, device: u32, bytes: u64) -> bool {
        match device_bit(device) {
            Some(bit) if self.user_threshold.load(Ordering::SeqCst) & bit == 0 => {
                self.program_threshold.fetch_or(bit, Ordering::SeqCst);
                self.store_device_threshold(device, bytes, true);
                true
            }
            _ => false,
        }
    }

    /// `device`'s own threshold, for now and for when its pool is made; `program`: set by the
    /// program, bounding the reserved bytes.
    fn store_device_threshold(&self, device: u32, bytes: u64, program: bool) {
        self.device_threshold[device as usize].store(encode_threshold(bytes), Ordering::SeqCst);
        self.apply_threshold(device, bytes, program);
    }

    /// `bytes` as the threshold of `device`'s pool, if it has one.
    fn apply_threshold(&self, device: u32, bytes: u64, program: bool) {
        if let Some(slot) = self.existing(device) {
            let mut p = Self::lock(slot);
            p.set_threshold(bytes, program);
            self.update_caches(slot, &mut p);
        }
    }

    /// The release threshold of `device`: its own, or the one it will start with.
    pub fn threshold(&self, device: u32) -> u64 {
        match self.existing(device) {
            Some(slot) => Self::lock(slot).threshold,
            None => self.initial_threshold(device),
        }
    }

    /// `cudaDeviceReset` on `device` succeeded: forget its memory (the driver freed it).
    pub fn forget_device(&self, device: u32) {
        let Some(slot) = self.existing(device) else {
            return;
        };
        self.forget_locked(slot, &mut Self::lock(slot));
    }

    /// The program reset `device`, or released its primary context for the last time. The
    /// driver freed the context's allocations but not virtual memory, so the pool gives back its
    /// expandable segments' mappings now, and forgets the device if it had any. Returns whether
    /// it forgot: the caller then does not forget again.
    pub fn release_mappings_after_reset(&self, device: u32) -> bool {
        let Some(slot) = self.existing(device) else {
            return false;
        };
        let mut p = Self::lock(slot);
        slot.caches.settle(&mut p, &slot.clock);
        if !p.unmap_all_after_reset(&self.backend) {
            return false;
        }
        self.forget_locked(slot, &mut p);
        true
    }

    /// The program resets `device`: `reset` makes CUDA's call and says whether it succeeded;
    /// then, as `release_mappings_after_reset` and `forget_device` do, the pool gives back its
    /// mappings and forgets the device. The device's lock is held across the reset: a request
    /// made between CUDA's reset and the forgetting would take a segment of the new context
    /// that the forgetting then loses, or index it beside the dead ones at an address the
    /// driver gave again. A device without a pool yet is only reset.
    pub fn reset_device(&self, device: u32, reset: impl FnOnce() -> bool) {
        let Some(slot) = self.existing(device) else {
            reset();
            return;
        };
        let mut p = Self::lock(slot);
        if reset() {
            slot.caches.settle(&mut p, &slot.clock);
            p.unmap_all_after_reset(&self.backend);
            self.forget_locked(slot, &mut p);
        }
    }

    /// `forget_device`, under the device lock: the driver took the device's memory back.
    pub(super) fn forget_locked(&self, slot: &DeviceSlot, p: &mut DevicePool) {
        // Settle the caches first, so that the device's totals account for their blocks.
        slot.caches.settle(p, &slot.clock);
        self.reset_freed.add(p.segment_spans());
        p.forget_all();
        slot.caches.forget(p.generation);
    }
}

/// The bit of `device` in `Pool::user_threshold`, for a device the pool serves.
fn device_bit(device: u32) -> Option<u64> {
    ((device as usize) < MAX_DEVICES).then(|| 1u64 << device)
}

/// A threshold as the atomics hold it: `u64::MAX` (keep everything) just below the sentinel.
fn encode_threshold(bytes: u64) -> u64 {
    bytes.min(NO_OVERRIDE - 1)
}

/// A threshold the atomics hold, `None` for "not set".
fn decode_threshold(stored: u64) -> Option<u64> {
    match stored {
        NO_OVERRIDE => None,
        t if t >= NO_OVERRIDE - 1 => Some(u64::MAX),
        t => Some(t),
    }
}
