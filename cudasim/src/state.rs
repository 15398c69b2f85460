//! The simulator's state (devices, allocations, streams, events, queued completions) behind
//! one lock, and the retirement of completed work.

use crate::config::{self, Config};
use crate::current;
use crate::errors::{CudaResult, CU_INVALID_CONTEXT, INVALID_RESOURCE_HANDLE};
use crate::handles::{self, EVENT_MAGIC, STREAM_MAGIC};
use crate::link;
use crate::memory::{self, Allocations};
use crate::pools::{PoolId, Pools};
use crate::timeline::{self, Completion, Nanos, Queue, StreamId, Streams};
use crate::vmm::{Refusal, Vmm};
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock, PoisonError};

/// The counters of a device (zeroed by `cudasimResetStats`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub malloc_calls: u64,
    pub malloc_failures: u64,
    pub free_calls: u64,
    pub device_syncs: u64,
    pub stream_syncs: u64,
    pub event_syncs: u64,
    pub implicit_syncs: u64,
    pub event_records: u64,
    pub stream_wait_events: u64,
    pub kernels_launched: u64,
    pub kernel_writes: u64,
    /// `cudaMallocAsync`/`cudaMallocFromPoolAsync` calls (failed ones too).
    pub async_mallocs: u64,
    /// Of those, the calls on a stream being captured.
    pub captured_mallocs: u64,
    /// Driver allocations (`cuMemAlloc_v2`, `cuMemAllocAsync`), failed ones too: also counted
    /// in `malloc_calls`, whoever called them (the runtime's own calls reach the driver).
    pub driver_mallocs: u64,
    /// Driver frees (`cuMemFree_v2`, `cuMemFreeAsync`) of non-NULL pointers: also counted in
    /// `free_calls`.
    pub driver_frees: u64,
    /// `cuMemCreate` calls that reached the allocation (failed ones too).
    pub vmm_creates: u64,
    /// Successful `cuMemMap` and `cuMemUnmap` calls.
    pub vmm_maps: u64,
    pub vmm_unmaps: u64,
    /// `cuMemUnmap` calls that found a kernel not yet complete on part of the range (a fault
    /// on a GPU; the unmap still happens).
    pub unmapped_while_busy: u64,
    /// Copies, sets and launches refused because a mapped range lacked the device's access.
    pub accessed_without_access: u64,
    /// Successful `cuMemCreate` calls whose prop asked for GPUDirect RDMA
    /// (`allocFlags.gpuDirectRDMACapable`).
    pub vmm_rdma_creates: u64,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Device {
    /// Whether the context exists (it takes `CUDASIM_CONTEXT_BYTES` of the capacity): the
    /// primary one, or one the program created, which shares those bytes here.
    pub context: bool,
    /// Whether the primary context is active (`cuDevicePrimaryCtxGetState`): retained, made
    /// current by `cudaSetDevice`, or used by a runtime call. A context the program created
    /// does not make it so, as in CUDA.
    pub primary_active: bool,
    pub live_allocations: u64,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    /// Physical bytes of its live `cuMemCreate` handles (also in `live_bytes`, as each
    /// handle is in `live_allocations`).
    pub vmm_created_bytes: u64,
    /// Bytes of its physical memory mapped into reserved ranges.
    pub vmm_mapped_bytes: u64,
    pub counters: Counters,
}

#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub device: usize,
    pub flags: u32,
    /// When the operation that recorded it completes; `None` until recorded.
    pub time: Option<Nanos>,
}

pub struct State {
    pub cfg: &'static Config,
    pub devices: Vec<Device>,
    pub allocs: Allocations,
    /// Reserved ranges, `cuMemCreate` handles and their mappings.
    pub vmm: Vmm,
    pub streams: Streams,
    pub events: HashMap<usize, Event>,
    pub queue: Queue,
    /// The memory pools: each device's default one, those the program created, and which is
    /// each device's current one.
    pub pools: Pools,
    /// The graphs `cudaGraphCreate` and `cudaStreamEndCapture` made and `cudaGraphDestroy` did
    /// not destroy yet.
    pub graphs: HashSet<usize>,
    /// The contexts `cuCtxCreate_v2` made and `cuCtxDestroy_v2` did not destroy yet, with
    /// their devices.
    pub contexts: HashMap<usize, usize>,
    /// The green contexts `cuGreenCtxCreate` made and `cuGreenCtxDestroy` did not destroy yet,
    /// with their context handles (also in `contexts`).
    pub green: HashMap<usize, usize>,
    /// The resource descriptors `cuDevResourceGenerateDesc` made, with their SM counts. CUDA 12
    /// has no call that destroys one: they stay.
    pub resource_descs: HashMap<usize, u32>,
    /// How many times each device's primary context is retained.
    pub primary_retains: Vec<u32>,
    /// (accessor, owner): peer access the program enabled (`api/peer.rs`).
    pub peer_access: HashSet<(usize, usize)>,
}

static STATE: OnceLock<Mutex<State>> = OnceLock::new();

/// What a fork's prepare handler holds until its parent and child handlers (which run on the
/// same thread): the driver link's lock, then the state lock. A child never starts with either
/// held by a thread it does not have, nor with the driver half linked. Like a real runtime's
/// own fork handling, it makes the simulator safe to call in a child (with a copy of the
/// parent's memory).
type ForkGuards = (
    std::sync::MutexGuard<'static, ()>,
    Option<std::sync::MutexGuard<'static, State>>,
);

thread_local! {
    static FORK_GUARDS: std::cell::RefCell<Option<ForkGuards>> =
        const { std::cell::RefCell::new(None) };
}

extern "C" fn fork_prepare() {
    // The link first: linking calls the driver, which takes the state lock.
    let linking = link::LINKING.lock().unwrap_or_else(PoisonError::into_inner);
    // Made here if no thread made it yet: another thread's first call may be making it, or
    // about to lock it, and a child would inherit the lock of a thread it does not have.
    let state = config::get().ok().map(|cfg| {
        STATE
            .get_or_init(|| make_state(cfg))
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    });
    let _ = FORK_GUARDS.try_with(|g| *g.borrow_mut() = Some((linking, state)));
}

extern "C" fn fork_release() {
    let _ = FORK_GUARDS.try_with(|g| g.borrow_mut().take());
}

/// The child's handler. The queued kernels are the parent's work, which the child's runtime
/// never runs. Mapped memory is a memfd mapped shared (`vmm/os.rs`): a fill the child applied
/// would land in the parent's memory, over what the parent stored there since. So the kernels
/// lose their writes, and the mappings become private to the child.
extern "C" fn fork_child() {
    let _ = FORK_GUARDS.try_with(|g| {
        if let Some((_, Some(state))) = g.borrow_mut().as_mut() {
            state.queue.drop_writes();
            state.vmm.privatize_after_fork();
        }
        g.borrow_mut().take()
    });
}

/// Registers the fork handlers, once, at the first read of the configuration, before the state
/// or the driver link is made (a process that never calls the simulator registers nothing).
pub fn watch_forks() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: registering plain extern "C" functions, once.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_release), Some(fork_child)) };
    });
}

fn make_state(cfg: &'static Config) -> Mutex<State> {
    watch_forks();
    Mutex::new(State::new(cfg))
}

/// Runs `f` under the state lock, after retiring the work completed by now.
pub fn with_state<R>(f: impl FnOnce(&mut State) -> CudaResult<R>) -> CudaResult<R> {
    let cfg = config::get()?;
    let lock = STATE.get_or_init(|| make_state(cfg));
    let mut state = lock.lock().unwrap_or_else(PoisonError::into_inner);
    state.retire(timeline::now());
    f(&mut state)
}

/// Sleeps (without the lock) until `deadline`, then retires what completed.
pub fn wait_until(deadline: Nanos) -> CudaResult {
    timeline::sleep_until(deadline);
    with_state(|_| Ok(()))
}

/// A synchronization of device `d`: sleeps until `deadline`, retires what completed, then lets
/// the device's memory pools release what they keep above their release thresholds.
pub fn synchronize(deadline: Nanos, d: usize) -> CudaResult {
    timeline::sleep_until(deadline);
    with_state(|st| {
        st.pools.release_on(d);
        Ok(())
    })
}

impl State {
    fn new(cfg: &'static Config) -> State {
        State {
            cfg,
            devices: vec![Device::default(); cfg.devices],
            allocs: Allocations::default(),
            vmm: Vmm::default(),
            streams: Streams::new(cfg.devices),
            events: HashMap::new(),
            queue: Queue::default(),
            pools: Pools::new(cfg.devices),
            graphs: HashSet::new(),
            contexts: HashMap::new(),
            green: HashMap::new(),
            resource_descs: HashMap::new(),
            primary_retains: vec![0; cfg.devices],
            peer_access: HashSet::new(),
        }
    }

    /// Applies the completions due at `now`: kernel fills (if their range is still mapped)
    /// and stream-ordered frees.
    pub fn retire(&mut self, now: Nanos) {
        for done in self.queue.take_due(now) {
            match done.what {
                Completion::Kernel {
                    device,
                    base,
                    len,
                    fill,
                } => {
                    let Some(byte) = fill else { continue };
                    let writable =
                        self.allocs.mapped_range(base, len) || self.vmm.writable(base, len);
                    if len > 0 && writable {
                        // SAFETY: `[base, base + len)` lies inside writable mappings this
                        // simulator made and still holds (checked just above, under the lock).
                        unsafe { std::ptr::write_bytes(base as *mut u8, byte, len) };
                        self.devices[device].counters.kernel_writes += 1;
                    }
                }
                Completion::AsyncFree { base, .. } => {
                    if self.allocs.pending_free_at(base) {
                        self.destroy_allocation(base);
                    }
                }
            }
        }
    }

    /// Device `d`, whose context now exists: its primary one, unless the calling thread's
    /// current context is one the program created.
    pub fn use_device(&mut self, d: usize) -> &mut Device {
        let primary = crate::context::created_current().is_none();
        let dev = &mut self.devices[d];
        dev.context = true;
        dev.primary_active |= primary;
        dev
    }

    /// Device `d`, whose primary context is now active.
    pub fn activate_primary(&mut self, d: usize) -> &mut Device {
        let dev = &mut self.devices[d];
        dev.context = true;
        dev.primary_active = true;
        dev
    }

    /// Bytes of device `d` neither allocated nor taken by its context.
    pub fn free_bytes(&self, d: usize) -> u64 {
        let dev = &self.devices[d];
        let context = if dev.context {
            self.cfg.context_bytes
        } else {
            0
        };
        self.cfg
            .capacity(d)
            .saturating_sub(context)
            .saturating_sub(dev.live_bytes)
            .saturating_sub(self.pools.kept_on(d))
    }

    /// Allocates `size` (> 0) bytes of `kind` for device `d`, from memory pool `pool` of that
    /// device if one is given (which gives its kept bytes first); device memory is accounted
    /// against the capacity (`cudaErrorMemoryAllocation` when it does not fit).
    pub fn allocate(
        &mut self,
        size: usize,
        d: usize,
        kind: memory::Kind,
        pool: Option<PoolId>,
    ) -> CudaResult<usize> {
        let figures = pool.map(|id| self.pools.entry(id).pool);
        let fits = |a: u64| {
            let needed = figures.map_or(a, |f| f.device_share(a));
            needed <= self.free_bytes(d)
        };
        let accounted = match kind {
            memory::Kind::Host => 0,
            _ => memory::accounted(size as u64)
                .filter(|&a| fits(a))
                .ok_or(crate::errors::MEMORY_ALLOCATION)?,
        };
        let base = self.allocs.create(size, accounted, d, kind, pool)?;
        // Device memory a created context was current for is that context's (CUDA frees it with
        // the context); a memory pool's is the device's, and a green context's the primary's.
        let owner = crate::context::created_current().filter(|&c| self.green_of(c).is_none());
        if let (memory::Kind::Device | memory::Kind::Managed, None, Some(ctx)) = (kind, pool, owner)
        {
            self.allocs.set_context(base, ctx);
        }
        if kind != memory::Kind::Host {
            let dev = &mut self.devices[d];
            dev.live_allocations += 1;
            dev.live_bytes += accounted;
            dev.peak_live_bytes = dev.peak_live_bytes.max(dev.live_bytes);
            if let Some(e) = pool.and_then(|id| self.pools.pool_mut(id)) {
                e.pool.take(accounted);
                e.mallocs += 1;
            }
        }
        Ok(base)
    }

    /// Unmaps the allocation at `base` and gives its bytes back to its device (to its memory
    /// pool, which keeps them, for a pooled one whose pool still exists).
    pub fn destroy_allocation(&mut self, base: usize) {
        if let Some(a) = self.allocs.destroy(base) {
            if a.kind != memory::Kind::Host {
                let dev = &mut self.devices[a.device];
                dev.live_allocations -= 1;
                dev.live_bytes -= a.accounted;
                if let Some(e) = a.pool.and_then(|id| self.pools.pool_mut(id)) {
                    e.pool.give_back(a.accounted);
                }
            }
        }
    }

    /// Checks that `device` may use `[addr, addr + len)` (`len` > 0) of device memory: it lies
    /// inside one live allocation, or in mapped memory (adjacent mappings too) that the device
    /// was given access to (`write`: to write). Mapped memory without that access is counted
    /// in `accessed_without_access`; either refusal is `cudaErrorInvalidValue`.
    pub fn check_device_range(
        &mut self,
        addr: usize,
        len: usize,
        device: usize,
        write: bool,
    ) -> CudaResult {
        if self.allocs.live_range(addr, len) {
            return Ok(());
        }
        match self.vmm.check(addr, len, device, write) {
            Ok(()) => Ok(()),
            Err(Refusal::NoAccess) => {
                self.devices[device].counters.accessed_without_access += 1;
                Err(crate::errors::INVALID_VALUE)
            }
            Err(Refusal::Unmapped) => Err(crate::errors::INVALID_VALUE),
        }
    }

    /// Resolves a `cudaStream_t`: `0`/`cudaStreamLegacy` and `cudaStreamPerThread` are the
    /// calling thread's current context's; others must be live created streams.
    pub fn stream(&self, raw: usize) -> CudaResult<StreamId> {
        match raw {
            0 | 1 => self.legacy_stream(),
            2 => Ok(StreamId::PerThread(
                current::get(),
                self.current_context()?,
                current::thread_key(),
            )),
            // SAFETY: the handle is in the registry, so it is a live handle made by `create`.
            h if self.streams.contains(h) && unsafe { handles::has_magic(h, STREAM_MAGIC) } => {
                Ok(StreamId::User(h))
            }
            _ => Err(INVALID_RESOURCE_HANDLE),
        }
    }

    /// The legacy default stream of the calling thread's current context.
    pub fn legacy_stream(&self) -> CudaResult<StreamId> {
        Ok(StreamId::Legacy(current::get(), self.current_context()?))
    }

    /// The calling thread's current context as streams name it: `None` for a primary context.
    /// A created context another thread destroyed is refused, as CUDA refuses it.
    fn current_context(&self) -> CudaResult<Option<usize>> {
        match crate::context::created_current() {
            Some(c) if !self.contexts.contains_key(&c) => Err(CU_INVALID_CONTEXT),
            context => Ok(context),
        }
    }

    /// The green context whose context handle `ctx` is, if any.
    pub fn green_of(&self, ctx: usize) -> Option<usize> {
        self.green.iter().find(|(_, &c)| c == ctx).map(|(&g, _)| g)
    }

    /// Resolves a `cudaEvent_t`.
    pub fn event(&self, raw: usize) -> CudaResult<Event> {
        match self.events.get(&raw) {
            // SAFETY: the handle is in the registry, so it is a live handle made by `create`.
            Some(e) if unsafe { handles::has_magic(raw, EVENT_MAGIC) } => Ok(*e),
            _ => Err(INVALID_RESOURCE_HANDLE),
        }
    }

    /// When all work of device `d` is done.
    pub fn device_tail(&self, d: usize) -> Nanos {
        self.streams.device_tail(d)
    }

    /// Drops everything of device `d` (`cudaDeviceReset`, once its work is done): its
    /// allocations, streams, events, queued completions, context, the pools created on it, and
    /// its default pool's figures and attributes (the default pool is current again). Counters stay, and virtual memory: as `cuCtxDestroy` documents, memory
    /// from `cuMemCreate` outlives the context (its handles, mappings and reservations).
    pub fn reset_device(&mut self, d: usize) {
        for base in self.allocs.of_device(d) {
            self.destroy_allocation(base);
        }
        // Peer access is the contexts', and the device's context goes.
        self.peer_access.retain(|&(a, o)| a != d && o != d);
        self.queue.forget_device(d);
        for h in self.streams.reset_device(d) {
            // SAFETY: `h` was a registered stream handle, now removed from the registry.
            unsafe { handles::destroy(h) };
        }
        let events: Vec<usize> = self
            .events
            .iter()
            .filter(|(_, e)| e.device == d)
            .map(|(&h, _)| h)
            .collect();
        for h in events {
            self.events.remove(&h);
            // SAFETY: `h` was a registered event handle, now removed from the registry.
            unsafe { handles::destroy(h) };
        }
        let dev = &mut self.devices[d];
        dev.context = false;
        dev.primary_active = false;
        dev.live_allocations = self.vmm.handles_of(d);
        dev.live_bytes = dev.vmm_created_bytes;
        // The context's pools go with it; the next default pool has the same handle.
        self.pools.reset_device(d);
    }
}
