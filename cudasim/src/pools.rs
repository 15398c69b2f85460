//! Every memory pool: each device's default one, the pools the program created
//! (`cudaMemPoolCreate`), and each device's current pool, which `cudaMallocAsync` allocates
//! from (`cudaDeviceSetMemPool`). The figures of one pool are `crate::mempool::Pool`.
//!
//! A pool is named two ways: by its handle (what the program holds) and by its id (what an
//! allocation records). Ids are never reused, so an allocation of a destroyed pool never
//! gives its bytes to a later pool whose handle happens to have the same address.

use crate::errors::{CudaResult, INVALID_VALUE};
use crate::handles::{self, POOL_MAGIC};
use crate::mempool::Pool;
use std::collections::BTreeMap;

/// The id of a pool: a device's default pool has the device's ordinal.
pub type PoolId = usize;

/// One live pool.
pub struct Entry {
    pub device: usize,
    pub handle: usize,
    pub pool: Pool,
    /// Allocations it served (`cudasimGetPoolMallocs`; zeroed by `cudasimResetStats`).
    pub mallocs: u64,
}

pub struct Pools {
    live: BTreeMap<PoolId, Entry>,
    /// Each device's current pool.
    current: Vec<PoolId>,
    next: PoolId,
    devices: usize,
}

impl Pools {
    /// The default pool of each of `devices` devices, each its device's current one.
    pub fn new(devices: usize) -> Pools {
        let live = (0..devices)
            .map(|d| {
                let entry = Entry {
                    device: d,
                    handle: handles::create(POOL_MAGIC),
                    pool: Pool::default(),
                    mallocs: 0,
                };
                (d, entry)
            })
            .collect();
        Pools {
            live,
            current: (0..devices).collect(),
            next: devices,
            devices,
        }
    }

    /// The pool of handle `raw`; `cudaErrorInvalidValue` for one that is no live pool.
    pub fn resolve(&self, raw: usize) -> CudaResult<PoolId> {
        self.live
            .iter()
            .find(|(_, e)| e.handle == raw)
            .map(|(&id, _)| id)
            .ok_or(INVALID_VALUE)
    }

    pub fn entry(&self, id: PoolId) -> &Entry {
        &self.live[&id]
    }

    /// The pool of handle `raw`, to change.
    pub fn entry_mut(&mut self, raw: usize) -> CudaResult<&mut Entry> {
        let id = self.resolve(raw)?;
        Ok(self.live.get_mut(&id).expect("resolved"))
    }

    /// Device `d`'s default pool.
    pub fn default_pool(&self, d: usize) -> &Pool {
        &self.live[&d].pool
    }

    /// Makes a pool on device `d`; returns its handle.
    pub fn create(&mut self, d: usize) -> usize {
        let handle = handles::create(POOL_MAGIC);
        let entry = Entry {
            device: d,
            handle,
            pool: Pool::default(),
            mallocs: 0,
        };
        self.live.insert(self.next, entry);
        self.next += 1;
        handle
    }

    /// Destroys the created pool of handle `raw`: its kept bytes go back to the device, and its
    /// device's current pool becomes the default one if it was this one. A default pool cannot
    /// be destroyed (`cudaErrorInvalidValue`). Its live allocations stay, and their frees give
    /// their bytes back to the device.
    pub fn destroy(&mut self, raw: usize) -> CudaResult {
        let id = self.resolve(raw)?;
        if id < self.devices {
            return Err(INVALID_VALUE);
        }
        self.drop_created(id);
        Ok(())
    }

    fn drop_created(&mut self, id: PoolId) {
        if let Some(e) = self.live.remove(&id) {
            if self.current[e.device] == id {
                self.current[e.device] = e.device;
            }
            // SAFETY: a handle `create` made, now out of the registry.
            unsafe { handles::destroy(e.handle) };
        }
    }

    /// Device `d`'s current pool.
    pub fn current(&self, d: usize) -> PoolId {
        self.current[d]
    }

    /// Makes the pool of handle `raw` device `d`'s current one: it must be a pool of that
    /// device (`cudaErrorInvalidValue` otherwise).
    pub fn set_current(&mut self, d: usize, raw: usize) -> CudaResult {
        let id = self.resolve(raw)?;
        if self.live[&id].device != d {
            return Err(INVALID_VALUE);
        }
        self.current[d] = id;
        Ok(())
    }

    /// The figures of pool `id`, if it is still live.
    pub fn pool_mut(&mut self, id: PoolId) -> Option<&mut Entry> {
        self.live.get_mut(&id)
    }

    /// The bytes the pools of device `d` keep (reserved, unused, still taken from the device).
    pub fn kept_on(&self, d: usize) -> u64 {
        self.of_device(d).map(|e| e.pool.kept).sum()
    }

    /// A synchronization of device `d`: each of its pools releases what it keeps above its
    /// release threshold.
    pub fn release_on(&mut self, d: usize) {
        for e in self.live.values_mut().filter(|e| e.device == d) {
            e.pool.release();
        }
    }

    /// `cudaDeviceReset` of device `d`: its default pool's figures and attributes go back to
    /// their defaults (the handle stays), the pools created on it are destroyed, and the
    /// default pool is current again.
    pub fn reset_device(&mut self, d: usize) {
        let created: Vec<PoolId> = self
            .live
            .iter()
            .filter(|(&id, e)| e.device == d && id >= self.devices)
            .map(|(&id, _)| id)
            .collect();
        for id in created {
            self.drop_created(id);
        }
        if let Some(e) = self.live.get_mut(&d) {
            e.pool = Pool::default();
        }
        self.current[d] = d;
    }

    /// Zeroes every pool's allocation count.
    pub fn reset_counts(&mut self) {
        for e in self.live.values_mut() {
            e.mallocs = 0;
        }
    }

    fn of_device(&self, d: usize) -> impl Iterator<Item = &Entry> {
        self.live.values().filter(move |e| e.device == d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_pools_follow_set_destroy_and_reset() {
        let mut p = Pools::new(2);
        let (d0, d1) = (p.entry(0).handle, p.entry(1).handle);
        assert_ne!(d0, d1);
        assert_eq!((p.current(0), p.current(1)), (0, 1));
        let mine = p.create(0);
        assert_eq!(
            p.set_current(1, mine),
            Err(INVALID_VALUE),
            "a pool of device 0"
        );
        p.set_current(0, mine).unwrap();
        let id = p.current(0);
        assert!(id >= 2);
        assert_eq!(p.destroy(d0), Err(INVALID_VALUE), "a default pool stays");
        p.pool_mut(id).unwrap().pool.take(1024);
        p.pool_mut(id).unwrap().pool.give_back(1024);
        assert_eq!(p.kept_on(0), 1024);
        p.destroy(mine).unwrap();
        assert_eq!(
            p.current(0),
            0,
            "destroying the current pool makes the default current"
        );
        assert_eq!(p.kept_on(0), 0);
        assert!(p.pool_mut(id).is_none());
        assert_eq!(p.resolve(mine), Err(INVALID_VALUE));
        let again = p.create(0);
        p.set_current(0, again).unwrap();
        p.reset_device(0);
        assert_eq!(p.current(0), 0);
        assert_eq!(p.resolve(again), Err(INVALID_VALUE));
        assert_eq!(p.resolve(d0), Ok(0));
        assert_eq!(p.resolve(0), Err(INVALID_VALUE));
    }
}
