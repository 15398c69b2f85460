//! The default memory pool of each device (`cudaDeviceGetDefaultMemPool`), which
//! `cudaMallocAsync` allocates from: the bytes its allocations use, the bytes it keeps after
//! their frees, its high-water marks and attributes.
//!
//! The model of the release threshold: a completed stream-ordered free moves its bytes from
//! *used* to *kept* (still reserved, still taken from the device's capacity); a synchronization
//! of the device (`cudaStreamSynchronize`, `cudaEventSynchronize`, `cudaDeviceSynchronize`)
//! then releases kept bytes until reserved (used + kept) is at most the threshold, as the
//! driver does. A later allocation from the pool takes from the kept bytes first (a count, not
//! addresses: every allocation is still a fresh mapping).

use crate::errors::{CudaResult, INVALID_VALUE};
use std::ffi::c_int;

/// An attribute of `enum cudaMemPoolAttr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attr {
    /// `cudaMemPoolReuseFollowEventDependencies` (1), `cudaMemPoolReuseAllowOpportunistic`
    /// (2), `cudaMemPoolReuseAllowInternalDependencies` (3): an `int`, 0 or 1, index 0–2.
    Reuse(usize),
    /// `cudaMemPoolAttrReleaseThreshold` (4).
    ReleaseThreshold,
    /// `cudaMemPoolAttrReservedMemCurrent` (5).
    ReservedCurrent,
    /// `cudaMemPoolAttrReservedMemHigh` (6).
    ReservedHigh,
    /// `cudaMemPoolAttrUsedMemCurrent` (7).
    UsedCurrent,
    /// `cudaMemPoolAttrUsedMemHigh` (8).
    UsedHigh,
}

impl Attr {
    /// The attribute of that value; `cudaErrorInvalidValue` for an unknown one.
    pub fn from_raw(raw: c_int) -> CudaResult<Attr> {
        Ok(match raw {
            1..=3 => Attr::Reuse(raw as usize - 1),
            4 => Attr::ReleaseThreshold,
            5 => Attr::ReservedCurrent,
            6 => Attr::ReservedHigh,
            7 => Attr::UsedCurrent,
            8 => Attr::UsedHigh,
            _ => return Err(INVALID_VALUE),
        })
    }

    /// Whether its value is an `int` (else a 64-bit unsigned integer).
    pub fn is_int(self) -> bool {
        matches!(self, Attr::Reuse(_))
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Pool {
    /// The three reuse policies (all enabled by default, as in CUDA).
    reuse: [bool; 3],
    release_threshold: u64,
    /// Bytes of its live allocations (each rounded as the device accounts it).
    pub used: u64,
    /// Bytes freed and kept: reserved but unused, still taken from the device's capacity.
    pub kept: u64,
    used_high: u64,
    reserved_high: u64,
}

impl Default for Pool {
    fn default() -> Pool {
        Pool {
            reuse: [true; 3],
            release_threshold: 0,
            used: 0,
            kept: 0,
            used_high: 0,
            reserved_high: 0,
        }
    }
}

impl Pool {
    /// Used plus kept bytes.
    pub fn reserved(&self) -> u64 {
        self.used + self.kept
    }

    /// How many of `bytes` an allocation would take from the device (the rest comes from the
    /// kept bytes).
    pub fn device_share(&self, bytes: u64) -> u64 {
        bytes - bytes.min(self.kept)
    }

    /// Records an allocation of `bytes`: the kept bytes first, then the device.
    pub fn take(&mut self, bytes: u64) {
        self.kept -= bytes.min(self.kept);
        self.used += bytes;
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved());
    }

    /// Records the free of an allocation of `bytes`: they are kept.
    pub fn give_back(&mut self, bytes: u64) {
        self.used -= bytes;
        self.kept += bytes;
    }

    /// Releases kept bytes until reserved is at most `keep` (`cudaMemPoolTrimTo`).
    pub fn trim_to(&mut self, keep: u64) {
        self.kept = self.kept.min(keep.saturating_sub(self.used));
    }

    /// What a synchronization does: trims to the release threshold.
    pub fn release(&mut self) {
        self.trim_to(self.release_threshold);
    }

    /// The value of `attr` (the reuse policies as 0 or 1).
    pub fn get(&self, attr: Attr) -> u64 {
        match attr {
            Attr::Reuse(i) => u64::from(self.reuse[i]),
            Attr::ReleaseThreshold => self.release_threshold,
            Attr::ReservedCurrent => self.reserved(),
            Attr::ReservedHigh => self.reserved_high,
            Attr::UsedCurrent => self.used,
            Attr::UsedHigh => self.used_high,
        }
    }

    /// Sets `attr`: a reuse policy to `value != 0`; a high-water mark only to 0, which resets
    /// it to the current value (as the driver does); the current figures not at all.
    pub fn set(&mut self, attr: Attr, value: u64) -> CudaResult {
        match attr {
            Attr::Reuse(i) => self.reuse[i] = value != 0,
            Attr::ReleaseThreshold => self.release_threshold = value,
            Attr::ReservedHigh if value == 0 => self.reserved_high = self.reserved(),
            Attr::UsedHigh if value == 0 => self.used_high = self.used,
            Attr::ReservedCurrent | Attr::UsedCurrent | Attr::ReservedHigh | Attr::UsedHigh => {
                return Err(INVALID_VALUE)
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_reuses_and_releases() {
        let mut p = Pool::default();
        p.take(1024);
        p.give_back(1024);
        assert_eq!((p.used, p.kept, p.reserved()), (0, 1024, 1024));
        assert_eq!(p.device_share(512), 0);
        assert_eq!(p.device_share(1536), 512);
        p.take(1536);
        assert_eq!((p.used, p.kept), (1536, 0));
        assert_eq!(p.get(Attr::UsedHigh), 1536);
        p.give_back(1536);
        p.set(Attr::ReleaseThreshold, 1024).unwrap();
        p.release();
        assert_eq!(p.kept, 1024);
        p.trim_to(0);
        assert_eq!(p.reserved(), 0);
        assert_eq!(p.get(Attr::ReservedHigh), 1536);
        p.set(Attr::ReservedHigh, 0).unwrap();
        assert_eq!(p.get(Attr::ReservedHigh), 0);
        assert_eq!(p.set(Attr::UsedHigh, 5), Err(INVALID_VALUE));
        assert_eq!(p.set(Attr::UsedCurrent, 0), Err(INVALID_VALUE));
        assert_eq!(Attr::from_raw(9), Err(INVALID_VALUE));
        assert_eq!(p.get(Attr::from_raw(2).unwrap()), 1);
    }
}
