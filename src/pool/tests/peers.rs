//! Peers of expandable segments (`device/peers.rs`, `peers.rs`): the granules a device mapped
//! get a peer's access when the program enables it, later mappings get it too, a refusal drops
//! the peer and is reported, and the mapped run around a block is what the pointer queries see.

use super::*;
use crate::pool::model_driver::{Call, VMM_GRANULE};
use std::sync::Mutex;

const DEVICE: u64 = 16 << 30;

/// A pool on two devices with expandable segments, strict reuse.
fn two_devices() -> Pool<ModelDriver> {
    let driver = ModelDriver::new()
        .with_capacity(DEVICE)
        .with_gap(GUARD_GAP)
        .with_vmm();
    let mut s = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 1)
        .settings()
        .clone();
    s.expandable = true;
    Pool::new(driver, s)
}

/// The program's `cudaDeviceSynchronize`.
fn program_sync<B: Backend>(p: &Pool<B>) {
    let at = p.seq_before_sync(0);
    p.observe_fence(0, at);
}

/// Whether every granule of the block at `addr` of `size` bytes gives `peer` access.
fn reachable<B: Backend + AsRef<ModelDriver>>(
    p: &Pool<B>,
    addr: Addr,
    size: u64,
    peer: u32,
) -> bool {
    let first = addr - addr % VMM_GRANULE;
    (first..addr + size)
        .step_by(VMM_GRANULE as usize)
        .all(|g| p.backend().as_ref().peers_at(g).contains(peer))
}

#[test]
fn a_peer_reaches_the_blocks_mapped_before_and_after_it_was_enabled() {
    let p = two_devices();
    let before = p.alloc(0, 7 * MIB).unwrap();
    assert!(
        !reachable(&p, before, 7 * MIB, 1),
        "no access before: device 1 is not in use"
    );
    p.add_peer(0, 1).unwrap();
    assert!(reachable(&p, before, 7 * MIB, 1));
    let after = p.alloc(0, 12 * MIB).unwrap();
    assert!(reachable(&p, after, 12 * MIB, 1));
    assert_eq!(p.peers_of(0), DeviceSet::one(1));
    assert!(p.peers_of(1).is_empty());
    // Freed, unmapped and mapped again: the new mapping has the access too.
    p.free(after, FreeKind::Sync, Some(0));
    program_sync(&p);
    p.empty_cache(0);
    let again = p.alloc(0, 12 * MIB).unwrap();
    assert!(reachable(&p, again, 12 * MIB, 1));
    assert_sound(&p);
}

#[test]
fn a_peer_enabled_before_the_device_allocated_is_kept() {
    let p = two_devices();
    p.add_peer(0, 1).unwrap();
    let a = p.alloc(0, 30 * MIB).unwrap();
    assert!(reachable(&p, a, 30 * MIB, 1));
}

#[test]
fn a_grant_refused_when_the_peer_is_enabled_drops_it_and_is_reported() {
    let p = two_devices();
    let a = p.alloc(0, 7 * MIB).unwrap();
    p.backend().fail_next(Call::Grant, 101);
    assert_eq!(p.add_peer(0, 1), Err(CudaError(101)));
    assert!(p.peers_of(0).is_empty(), "dropped again");
    assert!(!reachable(&p, a, 7 * MIB, 1));
    // Enabled again, it holds.
    p.add_peer(0, 1).unwrap();
    assert!(reachable(&p, a, 7 * MIB, 1));
    assert_sound(&p);
}

/// The model driver on devices of `DEVICE` bytes, refusing every grant that names a peer while
/// `refused` names it (with that code): a driver that stopped letting a peer in.
struct RefusesPeer {
    model: ModelDriver,
    refused: Mutex<Option<(u32, i32)>>,
}

impl RefusesPeer {
    fn pool() -> Pool<RefusesPeer> {
        let settings = two_devices().settings().clone();
        let model = ModelDriver::new()
            .with_capacity(DEVICE)
            .with_gap(GUARD_GAP)
            .with_vmm();
        let refused = Mutex::new(None);
        Pool::new(RefusesPeer { model, refused }, settings)
    }

    fn refuse(&self, peer: Option<u32>, code: i32) {
        *self.refused.lock().unwrap() = peer.map(|p| (p, code));
    }
}

impl AsRef<ModelDriver> for RefusesPeer {
    fn as_ref(&self) -> &ModelDriver {
        &self.model
    }
}

impl ModelWrapper for RefusesPeer {
    fn vmm_grant(
        &self,
        device: u32,
        addr: Addr,
        bytes: u64,
        peers: DeviceSet,
    ) -> Result<(), CudaError> {
        match *self.refused.lock().unwrap() {
            Some((peer, code)) if peers.contains(peer) => Err(CudaError(code)),
            _ => self.model.vmm_grant(device, addr, bytes, peers),
        }
    }
}

/// A refused access is no lack of memory: the request is served from the memory mapped for
/// it, the device keeps serving its own blocks, and only the refused peer goes (and is
/// reported), keeping what it was given before.
#[test]
fn a_grant_refused_at_a_later_mapping_drops_that_peer_and_the_device_keeps_serving() {
    let p = RefusesPeer::pool();
    let d = p.backend();
    let a = p.alloc(0, 7 * MIB).unwrap();
    p.add_peer(0, 1).unwrap();
    p.add_peer(0, 2).unwrap();
    d.refuse(Some(2), 101);
    let b = p.alloc(0, 20 * MIB).unwrap();
    assert_eq!(
        p.peers_of(0),
        DeviceSet::one(1),
        "peer 2 dropped, peer 1 kept"
    );
    assert_eq!(d.model.peers_dropped(), vec![(0, 2, CudaError(101))]);
    assert!(reachable(&p, b, 20 * MIB, 1));
    assert!(!reachable(&p, b, 20 * MIB, 2));
    assert!(reachable(&p, a, 7 * MIB, 2), "earlier grants stay");
    // No out-of-memory ladder: nothing unmapped and mapped again, nothing mapped unaccounted.
    let s = stats(&p, 0);
    assert_eq!((s.oom_retries, s.ooms), (0, 0));
    assert_eq!(d.model.counts().unmaps, 0);
    assert_eq!(s.reserved.current, d.model.mapped_on(0));
    // Later mappings ask nothing of the dropped peer.
    let c = p.alloc(0, 30 * MIB).unwrap();
    assert_eq!(d.model.peers_dropped().len(), 1);
    // The driver refuses peer 1 too, and it is the only peer: the same.
    d.refuse(Some(1), 101);
    let e = p.alloc(0, 40 * MIB).unwrap();
    assert!(p.peers_of(0).is_empty());
    assert_eq!(d.model.peers_dropped().len(), 2);
    assert_eq!(stats(&p, 0).reserved.current, d.model.mapped_on(0));
    // Enabled again once the driver lets it in: every block mapped gets the access.
    d.refuse(None, 0);
    p.add_peer(0, 2).unwrap();
    for (x, n) in [(a, 7), (b, 20), (c, 30), (e, 40)] {
        assert!(reachable(&p, x, n * MIB, 2), "{x:#x}");
    }
    for x in [a, b, c, e] {
        p.free(x, FreeKind::Sync, Some(0));
    }
    assert_eq!(stats(&p, 0).oom_retries, 0);
    assert_sound(&p);
}

#[test]
fn classic_segments_need_no_grant() {
    let mut s = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 1)
        .settings()
        .clone();
    s.expandable = false;
    let driver = ModelDriver::new().with_capacity(DEVICE).with_vmm();
    let p = Pool::new(driver, s);
    let a = p.alloc(0, 7 * MIB).unwrap();
    p.add_peer(0, 1).unwrap();
    assert!(p.backend().peers_at(a).is_empty());
    assert_eq!(
        p.mapped_run(a),
        None,
        "a classic segment is the driver's to report"
    );
}

#[test]
fn the_mapped_run_around_a_block_covers_it() {
    let p = two_devices();
    let a = p.alloc(0, 7 * MIB).unwrap();
    let b = p.alloc(0, 7 * MIB).unwrap();
    let (base, size) = p.mapped_run(b + 5).unwrap();
    assert!(base <= a && b + 7 * MIB <= base + size, "{base:#x}+{size}");
    assert_eq!(size % VMM_GRANULE, 0);
    assert_eq!(p.mapped_run(base + size), None, "past the mapped run");
}

#[test]
fn the_devices_in_use_reach_each_others_blocks() {
    let p = two_devices();
    let zero = p.alloc(0, 7 * MIB).unwrap();
    assert!(!reachable(&p, zero, 7 * MIB, 1));
    // Device 1 made current (`cudaSetDevice`), nothing allocated there: a copy with it current
    // must read device 0's block, as it reads `cudaMalloc` memory.
    p.note_device_in_use(1);
    assert!(reachable(&p, zero, 7 * MIB, 1));
    // Its own blocks, once it allocates, are device 0's to read too.
    let one = p.alloc(1, 12 * MIB).unwrap();
    assert!(reachable(&p, one, 12 * MIB, 0));
    assert_eq!(p.peers_of(0), DeviceSet::one(1));
    assert_eq!(p.peers_of(1), DeviceSet::one(0));
    // Noted again: nothing more to do.
    p.note_device_in_use(1);
    for (d, a) in [(0, zero), (1, one)] {
        p.free(a, FreeKind::Sync, Some(d));
    }
    assert_sound(&p);
}
