//! Test backends that change a few of the model driver's answers: a `ModelWrapper` implements
//! only the calls it answers its own way, and every other call goes to the `ModelDriver` it
//! wraps.

use super::backend::{Addr, Backend, CudaError, DeviceSet};
use super::model_driver::ModelDriver;

/// A backend that is the model driver it wraps (`AsRef`) but for the calls it answers its own
/// way: implement those, and every other call goes to the model (`impl Backend for W`). The
/// tests' drivers that model more (work in flight, an unreachable peer), the replay's (recorded
/// outcomes) and the policy comparison's are such wrappers.
pub trait ModelWrapper: AsRef<ModelDriver> + Send + Sync {
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        self.as_ref().alloc_segment(device, bytes)
    }
    fn free_segment(&self, device: u32, addr: Addr) -> Result<(), CudaError> {
        self.as_ref().free_segment(device, addr)
    }
    fn fence(&self, device: u32) -> Result<(), CudaError> {
        self.as_ref().fence(device)
    }
    fn barrier(&self, device: u32) -> Result<(), CudaError> {
        self.as_ref().barrier(device)
    }
    fn memory_info(&self, device: u32) -> Result<(u64, u64), CudaError> {
        self.as_ref().memory_info(device)
    }
    fn allocation_starts_at(&self, addr: Addr) -> Option<bool> {
        self.as_ref().allocation_starts_at(addr)
    }
    fn vmm_granularity(&self, device: u32) -> Option<u64> {
        self.as_ref().vmm_granularity(device)
    }
    fn vmm_reserve(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        self.as_ref().vmm_reserve(device, bytes)
    }
    fn vmm_map(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.as_ref().vmm_map(device, addr, bytes)
    }
    fn vmm_access(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.as_ref().vmm_access(device, addr, bytes)
    }
    fn vmm_grant(
        &self,
        device: u32,
        addr: Addr,
        bytes: u64,
        peers: DeviceSet,
    ) -> Result<(), CudaError> {
        self.as_ref().vmm_grant(device, addr, bytes, peers)
    }
    fn vmm_unmap(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.as_ref().vmm_unmap(device, addr, bytes)
    }
    fn vmm_free_reservation(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.as_ref().vmm_free_reservation(device, addr, bytes)
    }
    fn vmm_peers(&self, device: u32) -> Option<DeviceSet> {
        self.as_ref().vmm_peers(device)
    }
    fn vmm_stopped(&self, device: u32, why: CudaError) {
        self.as_ref().vmm_stopped(device, why)
    }
    fn vmm_peer_dropped(&self, device: u32, peer: u32, why: CudaError) {
        self.as_ref().vmm_peer_dropped(device, peer, why)
    }
}

impl<W: ModelWrapper> Backend for W {
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        ModelWrapper::alloc_segment(self, device, bytes)
    }
    fn free_segment(&self, device: u32, addr: Addr) -> Result<(), CudaError> {
        ModelWrapper::free_segment(self, device, addr)
    }
    fn fence(&self, device: u32) -> Result<(), CudaError> {
        ModelWrapper::fence(self, device)
    }
    fn barrier(&self, device: u32) -> Result<(), CudaError> {
        ModelWrapper::barrier(self, device)
    }
    fn memory_info(&self, device: u32) -> Result<(u64, u64), CudaError> {
        ModelWrapper::memory_info(self, device)
    }
    fn allocation_starts_at(&self, addr: Addr) -> Option<bool> {
        ModelWrapper::allocation_starts_at(self, addr)
    }
    fn vmm_granularity(&self, device: u32) -> Option<u64> {
        ModelWrapper::vmm_granularity(self, device)
    }
    fn vmm_reserve(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        ModelWrapper::vmm_reserve(self, device, bytes)
    }
    fn vmm_map(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        ModelWrapper::vmm_map(self, device, addr, bytes)
    }
    fn vmm_access(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        ModelWrapper::vmm_access(self, device, addr, bytes)
    }
    fn vmm_grant(
        &self,
        device: u32,
        addr: Addr,
        bytes: u64,
        peers: DeviceSet,
    ) -> Result<(), CudaError> {
        ModelWrapper::vmm_grant(self, device, addr, bytes, peers)
    }
    fn vmm_unmap(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        ModelWrapper::vmm_unmap(self, device, addr, bytes)
    }
    fn vmm_free_reservation(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        ModelWrapper::vmm_free_reservation(self, device, addr, bytes)
    }
    fn vmm_peers(&self, device: u32) -> Option<DeviceSet> {
        ModelWrapper::vmm_peers(self, device)
    }
    fn vmm_stopped(&self, device: u32, why: CudaError) {
        ModelWrapper::vmm_stopped(self, device, why)
    }
    fn vmm_peer_dropped(&self, device: u32, peer: u32, why: CudaError) {
        ModelWrapper::vmm_peer_dropped(self, device, peer, why)
    }
}
