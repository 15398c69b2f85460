//! What other devices and the program's pointer queries see of a device's expandable segments
//! (docs/design-notes.md, "Note: expandable segments"). The driver gives a peer access to
//! `cudaMalloc` memory once the program enables peer access; to mapped memory only
//! `cuMemSetAccess` does. So every run of mapped granules gets the access when a peer is added
//! (`grant_mapped`), and every later mapping with it (`grant_peers`, from `map_block`). A peer
//! the driver refuses is dropped: at the grant of what is mapped, the program's call to enable
//! it reports the refusal; at a later mapping, the backend does, and the request is served.

use super::*;
use crate::pool::backend::DeviceSet;
use crate::pool::peers::PeerSet;

impl DevicePool {
    /// Where this device's peers are kept (`Pool` keeps them, so that a peer enabled before
    /// this pool existed is not lost).
    pub fn share_peers(&mut self, peers: Arc<PeerSet>) {
        self.peers = peers;
    }

    /// The devices this device's mappings give access to, besides itself.
    fn peers(&self) -> DeviceSet {
        DeviceSet(self.peers.get().0 & !DeviceSet::one(self.device).0)
    }

    /// Give `peers` access to every granule mapped now: one grant per run of adjacent
    /// granules. The bytes granted.
    pub fn grant_mapped(
        &mut self,
        peers: DeviceSet,
        backend: &dyn Backend,
    ) -> Result<u64, CudaError> {
        let g = self.granule;
        let mut granted = 0;
        for (si, granules) in self.ranges.iter().filter(|r| r.1.mapped > 0) {
            let s = self.seg(*si);
            let (count, mut k) = (s.size / g, 0);
            while k < count {
                if !granules.is_mapped(k) {
                    k += 1;
                    continue;
                }
                let first = k;
                while k < count && granules.is_mapped(k) {
                    k += 1;
                }
                let bytes = (k - first) * g;
                backend.vmm_grant(self.device, s.addr + first * g, bytes, peers)?;
                granted += bytes;
            }
        }
        Ok(granted)
    }

    /// Give the peers access to granules `[first, end)` of segment `si`, all mapped now, just
    /// before a block there is handed out (those mapped before get it again: harmless). A
    /// refusal is no lack of memory: the peers are asked one at a time, and each one refused
    /// is dropped and reported (`Backend::vmm_peer_dropped`); the device keeps the mapping and
    /// serves the request.
    pub(super) fn grant_peers(&self, si: u32, first: u64, end: u64, backend: &dyn Backend) {
        let peers = self.peers();
        if peers.is_empty() {
            return;
        }
        let (base, g) = (self.seg(si).addr, self.granule);
        let (addr, bytes) = (base + first * g, (end - first) * g);
        if backend.vmm_grant(self.device, addr, bytes, peers).is_ok() {
            return;
        }
        for peer in peers.iter() {
            if let Err(e) = backend.vmm_grant(self.device, addr, bytes, DeviceSet::one(peer)) {
                self.peers.remove(peer);
                backend.vmm_peer_dropped(self.device, peer, e);
            }
        }
    }

    /// The run of mapped granules around `addr`, if it lies in one of this device's
    /// expandable segments: what `cuMemGetAddressRange` reports for a block there.
    pub fn mapped_run_at(&self, addr: Addr) -> Option<(Addr, u64)> {
        let (_, &si) = self.by_addr.range(..=addr).next_back()?;
        let s = self.seg(si);
        (s.expandable && addr < s.addr + s.size)
            .then(|| self.mapped_run(si, addr))
            .flatten()
    }

    /// The run of mapped granules around `addr` in expandable segment `si`, as (base, size):
    /// what the driver reports as the allocation holding `addr`.
    pub(super) fn mapped_run(&self, si: u32, addr: Addr) -> Option<(Addr, u64)> {
        let s = self.seg(si);
        let granules = self.range_granules(si)?;
        let g = self.granule;
        let k = (addr - s.addr) / g;
        if !granules.is_mapped(k) {
            return None;
        }
        let mut first = k;
        while first > 0 && granules.is_mapped(first - 1) {
            first -= 1;
        }
        let mut end = k + 1;
        while end < s.size / g && granules.is_mapped(end) {
            end += 1;
        }
        Some((s.addr + first * g, (end - first) * g))
    }
}
