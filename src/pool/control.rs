//! The program's settings at run time: release threshold, limit, empty-cache, device reset.

use super::*;

impl<B: Backend> Pool<B> {
    /// The threshold `device` starts with: the run-time override, or the configured one.
    pub(super) fn initial_threshold(&self, device: u32) -> u64 {
        match self.threshold_override.load(Ordering::Relaxed) {
            NO_OVERRIDE => self.resolve(self.settings.threshold, device),
            // `set_threshold(u64::MAX)` (keep everything) is stored just below the sentinel.
            t if t >= NO_OVERRIDE - 1 => u64::MAX,
            t => t,
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
            None => self.resolve(self.settings.limit, device),
        }
    }

    /// Release every whole free segment of `device`. Returns the bytes released.
    pub fn empty_cache(&self, device: u32) -> u64 {
        self.trim_to(device, 0)
    }

    /// Release whole free segments of `device` until at most `keep` bytes stay reserved.
    /// Returns the bytes released.
    pub fn trim_to(&self, device: u32, keep: u64) -> u64 {
        let Some(slot) = self.existing(device) else {
            return 0;
        };
        let mut p = Self::lock(slot);
        slot.caches.sweep_orphans(&mut p, &slot.clock);
        slot.caches.reclaim(&mut p, &slot.clock);
        p.trim_to(&self.timed(slot), &slot.clock, keep)
    }

    /// Start every figure's peak of `device` over again from its current value.
    pub fn reset_peaks(&self, device: u32) {
        if let Some(slot) = self.existing(device) {
            let mut p = Self::lock(slot);
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
            match reserved {
                true => p.stats.reserved.reset_peak(),
                false => p.stats.allocated.reset_peak(),
            }
        }
    }

    /// Set the release threshold of every device, now and for devices not yet used.
    pub fn set_threshold(&self, bytes: u64) {
        self.threshold_override
            .store(bytes.min(NO_OVERRIDE - 1), Ordering::Relaxed);
        for d in 0..MAX_DEVICES as u32 {
            if let Some(slot) = self.existing(d) {
                let mut p = Self::lock(slot);
                p.set_threshold(bytes);
                self.update_caches(slot, &mut p);
            }
        }
    }

    /// Set the release threshold of `device` alone (its pool is made if it was not used yet).
    /// Returns false for a device the pool does not serve.
    pub fn set_device_threshold(&self, device: u32, bytes: u64) -> bool {
        match self.slot(device) {
            Some(slot) => {
                let mut p = Self::lock(slot);
                p.set_threshold(bytes);
                self.update_caches(slot, &mut p);
                true
            }
            None => false,
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
        Self::forget_locked(slot, &mut Self::lock(slot));
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
        Self::forget_locked(slot, &mut p);
        true
    }

    /// `forget_device`, under the device lock.
    pub(super) fn forget_locked(slot: &DeviceSlot, p: &mut DevicePool) {
        // Settle the caches first, so that the device's totals account for their blocks.
        slot.caches.settle(p, &slot.clock);
        p.forget_all();
        slot.caches.forget(p.generation);
    }
}
