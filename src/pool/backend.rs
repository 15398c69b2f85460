//! What the pool needs from a device: the only door between the algorithm and CUDA.
//!
//! The FFI implementation lives in `crate::cuda`; tests and the offline replay use their own.

/// A device address.
pub type Addr = u64;

/// A CUDA runtime error code (never 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaError(pub i32);

impl CudaError {
    pub const INVALID_VALUE: CudaError = CudaError(1);
    pub const MEMORY_ALLOCATION: CudaError = CudaError(2);
    /// `cudaErrorInvalidDevice`.
    pub const INVALID_DEVICE: CudaError = CudaError(101);
    /// `cudaErrorNotSupported`: a backend without virtual memory calls.
    pub const NOT_SUPPORTED: CudaError = CudaError(801);
    /// `cudaErrorStreamCaptureUnsupported`: no fence or barrier during a graph capture.
    pub const STREAM_CAPTURE_UNSUPPORTED: CudaError = CudaError(900);
    pub const UNKNOWN: CudaError = CudaError(999);
}

/// A set of device ordinals below 64 (`MAX_DEVICES`): the peers given access to a device's
/// mapped memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceSet(pub u64);

impl DeviceSet {
    /// The set of `device` alone (empty for an ordinal of 64 or more).
    pub fn one(device: u32) -> DeviceSet {
        DeviceSet(1u64.checked_shl(device).unwrap_or(0))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn contains(self, device: u32) -> bool {
        !(self & DeviceSet::one(device)).is_empty()
    }

    /// The ordinals in the set, lowest first.
    pub fn iter(self) -> impl Iterator<Item = u32> {
        // A bit at a time, not the 64 ordinals: the barrier walks the set at each call.
        let mut bits = self.0;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let d = bits.trailing_zeros();
                bits &= bits - 1;
                d
            })
        })
    }
}

impl std::ops::BitOr for DeviceSet {
    type Output = DeviceSet;
    fn bitor(self, other: DeviceSet) -> DeviceSet {
        DeviceSet(self.0 | other.0)
    }
}

impl std::ops::BitAnd for DeviceSet {
    type Output = DeviceSet;
    fn bitand(self, other: DeviceSet) -> DeviceSet {
        DeviceSet(self.0 & other.0)
    }
}

pub trait Backend: Send + Sync {
    /// Allocate `bytes` on `device`, which is the calling thread's current device (a real
    /// `cudaMalloc`).
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError>;
    /// Give a segment back (a real `cudaFree`, which itself waits for the device's work).
    fn free_segment(&self, device: u32, addr: Addr) -> Result<(), CudaError>;
    /// Wait for all work that may use `device`'s memory, whatever device is current: every
    /// stream of `device` (`cudaDeviceSynchronize` with `device` current), and of the devices
    /// the program gave peer access to it.
    fn fence(&self, device: u32) -> Result<(), CudaError>;
    /// Enqueue one action on the legacy default stream of `device`, whatever device is current,
    /// which orders all later blocking-stream work after all earlier blocking-stream work, of
    /// `device` and of the devices the program gave peer access to it. No host wait.
    fn barrier(&self, device: u32) -> Result<(), CudaError>;
    /// Free and total memory of `device`, the current device (`cudaMemGetInfo`). Asked when the
    /// threshold is a percentage, after each new segment and at out-of-memory: never at exit.
    fn memory_info(&self, device: u32) -> Result<(u64, u64), CudaError>;
    /// Whether an allocation of the driver starts at `addr` (`cuMemGetAddressRange`), asked of
    /// a program's free of memory a reset took back; `None` where the driver cannot say.
    fn allocation_starts_at(&self, _addr: Addr) -> Option<bool> {
        None
    }

    // CUDA virtual memory, for expandable segments (`device/expandable.rs`). The default bodies
    // mean "not supported": the pool then keeps classic segments.

    /// The granule physical memory is mapped in on `device` (`cuMemGetAllocationGranularity`),
    /// or `None` when the backend cannot map memory.
    fn vmm_granularity(&self, _device: u32) -> Option<u64> {
        None
    }
    /// Reserve `bytes` of address space on `device`, no memory behind it
    /// (`cuMemAddressReserve`).
    fn vmm_reserve(&self, _device: u32, _bytes: u64) -> Result<Addr, CudaError> {
        Err(CudaError::NOT_SUPPORTED)
    }
    /// Map `bytes` of new physical memory of `device` at `addr`, inside a reservation
    /// (`cuMemCreate`, `cuMemMap`): one mapping, unmapped whole. No access yet: `vmm_access`
    /// gives it, once for a run of new mappings. A refusal leaves nothing mapped.
    fn vmm_map(&self, _device: u32, _addr: Addr, _bytes: u64) -> Result<(), CudaError> {
        Err(CudaError::NOT_SUPPORTED)
    }
    /// Give `device` read and write access to `[addr, addr + bytes)`, whole mappings `vmm_map`
    /// just made side by side (one `cuMemSetAccess` for the run). Before it, nothing may use
    /// them; refused, the caller unmaps them.
    fn vmm_access(&self, _device: u32, _addr: Addr, _bytes: u64) -> Result<(), CudaError> {
        Err(CudaError::NOT_SUPPORTED)
    }
    /// Give `peers`, devices other than `device`, read and write access to `[addr, addr +
    /// bytes)`, memory of `device` that `vmm_map` mapped, in one or more mappings
    /// (`cuMemSetAccess`). The driver gives peers access to `cudaMalloc` memory itself once the
    /// program enables peer access; to mapped memory only this does.
    fn vmm_grant(
        &self,
        _device: u32,
        _addr: Addr,
        _bytes: u64,
        _peers: DeviceSet,
    ) -> Result<(), CudaError> {
        Err(CudaError::NOT_SUPPORTED)
    }
    /// Unmap the mapping of `bytes` at `addr` and release its memory (`cuMemUnmap`,
    /// `cuMemRelease`). Waits for nothing: the caller proves the work that used it done.
    fn vmm_unmap(&self, _device: u32, _addr: Addr, _bytes: u64) -> Result<(), CudaError> {
        Err(CudaError::NOT_SUPPORTED)
    }
    /// Give a reservation of `bytes` at `addr` back, nothing mapped in it (`cuMemAddressFree`).
    fn vmm_free_reservation(
        &self,
        _device: u32,
        _addr: Addr,
        _bytes: u64,
    ) -> Result<(), CudaError> {
        Err(CudaError::NOT_SUPPORTED)
    }
    /// The other devices that can be given access to `device`'s mapped memory
    /// (`cuDeviceCanAccessPeer`), or `None` when some visible device cannot: a copy made with
    /// that device current would fail on mapped memory, where it works on `cudaMalloc`
    /// memory, so the device keeps classic segments.
    fn vmm_peers(&self, _device: u32) -> Option<DeviceSet> {
        Some(DeviceSet::default())
    }
    /// The pool turned expandable segments off on `device`: the driver refused a mapping with
    /// `why`, not for lack of memory, before any worked. A backend that can tell the user does.
    fn vmm_stopped(&self, _device: u32, _why: CudaError) {}
    /// The driver refused `peer` access to a new mapping of `device`'s memory with `why`, after
    /// the peer had it: the pool dropped the peer, whose kernels cannot use the blocks mapped
    /// there from now on, until the program enables peer access again. A backend that can tell
    /// the user does.
    fn vmm_peer_dropped(&self, _device: u32, _peer: u32, _why: CudaError) {}
}

#[cfg(test)]
mod tests {
    use super::DeviceSet;

    #[test]
    fn a_device_set_lists_its_ordinals_lowest_first() {
        assert_eq!(DeviceSet::default().iter().count(), 0);
        let set = DeviceSet::one(63) | DeviceSet::one(5) | DeviceSet::one(0);
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 5, 63]);
        assert!(set.iter().all(|d| set.contains(d)));
    }
}
