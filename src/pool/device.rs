//! One device's pool: segments from the driver carved into blocks, best fit over cached free
//! blocks, split and merge, freed blocks that wait for a fence or barrier before reuse, and
//! release of whole free segments. Single-threaded: the caller holds the device's lock.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::backend::{Addr, Backend, CudaError};
use super::free_lists::FreeLists;
use super::size::{
    class_of, may_serve, round_request, segment_size, should_split, Class, ALIGN, GROW_FROM,
    OUTGROWN_FROM, SMALL_LIMIT,
};
use super::stats::{counted, DeviceStats};
use super::trace::{Kind, TraceBuf};
use super::{AddrHasher, FreeKind, IntHasher, Seqs, StreamKey, NO_STREAM};

/// Small blocks freed and reusable wait in exact-size bins, up to this many bytes per device
/// (or an eighth of its reserved memory, if more): a request of the same size takes one back
/// without touching the best-fit index. Bins are merged back into the index whenever a request
/// finds no fit, and before any release, so they never make the pool grow. As large as the
/// default fence budget, so that what one fence makes reusable fits in the bins.
const BIN_BYTES: u64 = 256 << 20;
const BINS: usize = (SMALL_LIMIT / ALIGN) as usize;

const NONE: u32 = u32::MAX;

/// Pending queues this long (together) are compacted when stream-ordered reuse adds to them.
const COMPACT_FROM: usize = 4096;
/// Streams whose held set stays in `DevicePool::held` once emptied (a stream that frees and
/// allocates in turn would otherwise drop and remake its set on every pair); beyond that, an
/// emptied set goes, so destroyed streams leave nothing behind.
const EMPTY_HELD_SETS: usize = 16;

/// Streams the trace numbers per device; later ones share the last number (a replay then lets
/// them reuse each other's blocks, which only lowers its figures).
const TRACE_STREAMS: u16 = (1 << 14) - 1;

/// Extra blocks one `alloc_lent` lends, at most.
pub const EXTRAS: usize = 32;

/// Blocks lent besides the one served (a fixed array: the miss path allocates nothing).
#[derive(Default)]
pub struct Extras {
    items: [(Addr, u32); EXTRAS],
    len: usize,
}

impl Extras {
    fn push(&mut self, item: (Addr, u32)) {
        self.items[self.len] = item;
        self.len += 1;
    }

    /// (address, handle) of each block lent.
    pub fn iter(&self) -> impl Iterator<Item = (Addr, u32)> + '_ {
        self.items[..self.len].iter().copied()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The slot holds no block.
    Vacant,
    Live,
    /// Cached and reusable: in the best-fit index.
    Free,
    /// Cached and reusable: in the exact-size bin of its size (not merged with neighbours).
    Binned,
    /// Freed by the program but maybe still used by in-flight work: not reusable yet.
    Pending,
    /// Held by a thread cache (`tcache.rs`), handed out from there or waiting there for reuse;
    /// counted as allocated at its full size until it comes back.
    Lent,
}

/// What must happen before a freed block may be handed out again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing: reusable at once (relaxed mode).
    Nothing,
    /// One legacy-stream action (covers blocking streams).
    Barrier,
    /// A device-wide fence (covers every stream).
    Fence,
}

impl Need {
    /// What a `Free` record's code (`need as u64`, `DevicePool::after_free`'s record) says the
    /// block's reuse waited for.
    pub fn from_code(code: u64) -> Need {
        match code {
            0 => Need::Nothing,
            1 => Need::Barrier,
            _ => Need::Fence,
        }
    }
}

#[derive(Clone, Debug)]
struct Block {
    addr: Addr,
    size: u64,
    requested: u64,
    seg: u32,
    prev: u32,
    next: u32,
    state: State,
    /// The device's free sequence number at the time of the free (pending blocks only).
    stamp: u64,
    /// A pending block waits for a fence (else for a barrier).
    wants_fence: bool,
    /// A pending block held for the stream it was freed on (`DevicePool::held_by` names it),
    /// which may reuse it at once (`DevicePool::stream_reuse`). A flag, not the key: blocks stay
    /// 48 bytes, and the hit path reads nothing more.
    held: bool,
}

#[derive(Clone, Debug)]
struct Segment {
    addr: Addr,
    size: u64,
    class: Class,
    /// Live blocks inside; a segment with none can go back to the driver.
    live: u32,
    first: u32,
}

/// Settings shared by every device.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub max_split_size: u64,
    pub fence_bytes: u64,
}

/// Why segments are released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    Threshold,
    EmptyCache,
    OutOfMemory,
    /// A request larger than every segment so far replaced idle segments it outgrew.
    Outgrown,
}

/// What `cudaMemGetInfo` said of the device, sampled after each new segment and at
/// out-of-memory (never at exit, when the runtime may be unloading).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySample {
    pub free: u64,
    pub total: u64,
    /// The pool's reserved bytes at that moment.
    pub reserved: u64,
}

impl MemorySample {
    /// Device memory in use outside the pool: the CUDA context, other allocators, other
    /// processes.
    pub fn outside_pool(&self) -> u64 {
        self.total
            .saturating_sub(self.free)
            .saturating_sub(self.reserved)
    }
}

/// The last out-of-memory the pool gave back to the program, and what it had tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomEvent {
    /// The request, rounded.
    pub requested: u64,
    /// The segment the pool asked the driver for again after releasing cached memory (the
    /// request's own segment size, without room to grow).
    pub segment: u64,
    /// Cached bytes it released to the driver before retrying.
    pub released: u64,
    /// Whether it fenced to make pending blocks reusable first.
    pub fenced: bool,
    /// The pool's limit (`GPUPOOL_LIMIT`) refused a segment the retry asked for: the driver
    /// may have had the memory.
    pub limited: bool,
    pub memory: Option<MemorySample>,
}

/// A live block as the pool reports it (for the leak list and IPC checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub addr: Addr,
    pub size: u64,
    pub requested: u64,
    pub segment_addr: Addr,
}

pub struct DevicePool {
    device: u32,
    /// Live blocks by address.
    live: HashMap<Addr, u32, BuildHasherDefault<AddrHasher>>,
    bins: Vec<Vec<u32>>,
    /// Bins that may hold blocks (a bit set on every push, all cleared by a flush), so a flush
    /// visits those alone rather than all 2 048: a workload of ever-different small sizes
    /// flushes often.
    bin_mask: [u64; BINS / 64],
    binned_bytes: u64,
    blocks: Vec<Block>,
    vacant_blocks: Vec<u32>,
    segments: Vec<Option<Segment>>,
    vacant_segments: Vec<u32>,
    by_addr: BTreeMap<Addr, u32>,
    /// Free small blocks by exact size (`free_lists.rs`); large ones by (size, address).
    free_small: FreeLists,
    free_large: BTreeMap<(u64, Addr), u32>,
    pending_fence: VecDeque<(u32, u64)>,
    pending_barrier: VecDeque<(u32, u64)>,
    pending_fence_bytes: u64,
    pending_barrier_bytes: u64,
    /// Stream-ordered reuse (`relaxed` mode): a block freed on a stream waits for its barrier or
    /// fence as any other, but a request on the same stream may take it at once, since the
    /// stream runs its work after the work that freed it. By stream: (large segment, size,
    /// handle) of each such block.
    pub stream_reuse: bool,
    /// An allocation named its stream: until then no request could take a held block (a
    /// program that frees with `cudaFreeAsync` but allocates with `cudaMalloc` holds nothing).
    stream_requests: bool,
    held: HashMap<StreamKey, BTreeSet<(bool, u64, u32)>, BuildHasherDefault<IntHasher>>,
    /// The stream each held block is held for, by block handle (meaningful while the block's
    /// `held` flag is set), and how many blocks are held.
    held_by: Vec<StreamKey>,
    held_blocks: usize,
    /// Queue length (both queues) at which `compact_queues` next drops stale entries.
    compact_at: usize,
    /// The trace's number of each stream (tracing only).
    stream_ids: HashMap<StreamKey, u16>,
    /// Highest fence and barrier sequences this pool has applied, to tell the program's
    /// synchronizations from its own.
    fenced_seen: u64,
    barriered_seen: u64,
    /// The allocation trace, when `GPUPOOL_TRACE` is on.
    trace: Option<TraceBuf>,
    /// Cached bytes to keep; above it whole free segments go back to the driver.
    pub threshold: u64,
    /// The most bytes this pool may reserve (`GPUPOOL_LIMIT`; `u64::MAX`: none). A segment
    /// that would take it past is refused as the driver refuses one, so the out-of-memory
    /// ladder (release, retry smaller) runs as it does for the driver.
    pub limit: u64,
    /// The limit refused a segment since the out-of-memory retry began.
    limit_refused: bool,
    /// The device's memory as last sampled.
    pub memory: Option<MemorySample>,
    /// The first sample: what was in use outside the pool when it began (the CUDA context,
    /// and what the program had allocated otherwise by then).
    pub memory_first: Option<MemorySample>,
    pub last_oom: Option<OomEvent>,
    pub stats: DeviceStats,
    /// The largest large segment allocated so far (a larger request releases the idle segments
    /// it outgrew; none above `GROW_FROM` yet: the next such request gets room to grow).
    largest_segment: u64,
    /// Bytes of the segments without a live or lent block: the most a release could give back
    /// (zero lets a release threshold that cannot be met skip the scan of every segment).
    idle_bytes: u64,
    /// Blocks lent to thread caches.
    lent: u64,
    /// Allocations served under the device lock (to sample which threads allocate).
    pub lock_allocs: u64,
    /// How threads competed for the device's lock while thread caches were off.
    pub contention: super::tcache::Contention,
    /// Bumped by `forget_all`: thread caches drop what they hold from an earlier generation.
    pub generation: u64,
    /// Whoever holds blocks this pool lent (the device's thread caches).
    lenders: Option<Arc<dyn Lenders>>,
}

/// What a device pool asks of the holders of the blocks it lent (`tcache.rs`). Called under
/// the device's lock.
pub trait Lenders: Send + Sync {
    /// Give every free block back (out of memory).
    fn reclaim(&self, p: &mut DevicePool, seqs: &Seqs);
    /// Give the reusable blocks back (the pool would grow otherwise). Whether any came back.
    fn reclaim_ready(&self, p: &mut DevicePool, seqs: &Seqs) -> bool;
    /// Give back some of the reusable blocks of exactly `size` bytes (what one holder keeps
    /// of a size another lacks). Whether any came back.
    fn reclaim_size(&self, p: &mut DevicePool, seqs: &Seqs, size: u64) -> bool;
    /// Bytes held that wait for a barrier, and for a fence.
    fn waiting(&self, p: &DevicePool) -> (u64, u64);
}

impl DevicePool {
    pub fn new(device: u32, threshold: u64) -> Self {
        DevicePool {
            device,
            live: HashMap::default(),
            bins: vec![Vec::new(); BINS],
            bin_mask: [0; BINS / 64],
            binned_bytes: 0,
            blocks: Vec::new(),
            vacant_blocks: Vec::new(),
            segments: Vec::new(),
            vacant_segments: Vec::new(),
            by_addr: BTreeMap::new(),
            free_small: FreeLists::default(),
            free_large: BTreeMap::new(),
            pending_fence: VecDeque::new(),
            pending_barrier: VecDeque::new(),
            pending_fence_bytes: 0,
            pending_barrier_bytes: 0,
            stream_reuse: false,
            stream_requests: false,
            held: HashMap::default(),
            held_by: Vec::new(),
            held_blocks: 0,
            compact_at: COMPACT_FROM,
            stream_ids: HashMap::new(),
            fenced_seen: 0,
            barriered_seen: 0,
            trace: None,
            threshold,
            limit: u64::MAX,
            limit_refused: false,
            memory: None,
            memory_first: None,
            last_oom: None,
            stats: DeviceStats::default(),
            largest_segment: 0,
            idle_bytes: 0,
            lent: 0,
            lock_allocs: 0,
            contention: Default::default(),
            generation: 0,
            lenders: None,
        }
    }

    /// Who will hold the blocks this pool lends.
    pub fn set_lenders(&mut self, lenders: Arc<dyn Lenders>) {
        self.lenders = Some(lenders);
    }

    /// Record every decision from now on into `trace`.
    pub fn set_trace(&mut self, trace: TraceBuf, policy: &Policy, reuse: u16) {
        self.trace = Some(trace);
        self.record(
            Kind::Settings,
            policy.max_split_size,
            policy.fence_bytes,
            self.threshold,
            reuse,
        );
    }

    /// The program created a non-blocking stream (for the trace: a replay in `barrier` mode
    /// fences from here on, as the live pool does).
    pub fn note_nonblocking_stream(&mut self) {
        self.record(Kind::NonBlockingStream, 0, 0, 0, 0);
    }

    /// One trace record, when tracing.
    #[inline]
    fn record(&mut self, kind: Kind, a: u64, b: u64, c: u64, aux: u16) {
        if let Some(t) = self.trace.as_mut() {
            t.record(kind, a, b, c, aux);
        }
    }

    /// Hand buffered trace records to the sink.
    pub fn flush_trace(&mut self) {
        if let Some(t) = self.trace.as_mut() {
            t.flush();
        }
    }

    /// Cached bytes: reserved from the driver but not handed out (free or pending).
    pub fn cached(&self) -> u64 {
        self.stats.reserved.current - self.stats.allocated.current
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_fence_bytes + self.pending_barrier_bytes
    }

    /// The largest block that could be handed out now.
    pub fn largest_free(&self) -> u64 {
        let small = self.free_small.largest().unwrap_or(0);
        let large = self.free_large.keys().next_back().map_or(0, |k| k.0);
        let binned = self
            .bins
            .iter()
            .rposition(|b| !b.is_empty())
            .map_or(0, |k| (k as u64 + 1) * ALIGN);
        small.max(large).max(binned)
    }

    /// The bin of blocks of exactly `rounded` bytes, for small sizes.
    fn bin_of(rounded: u64) -> Option<usize> {
        (rounded <= SMALL_LIMIT).then(|| (rounded / ALIGN) as usize - 1)
    }

    /// A reusable block: into its exact-size bin while there is room, else merged and indexed.
    fn recycle(&mut self, idx: u32) {
        self.leave_stream(idx);
        let size = self.blocks[idx as usize].size;
        let small = self.seg(self.blocks[idx as usize].seg).class == Class::Small;
        match Self::bin_of(size) {
            Some(k)
                if small
                    && self.binned_bytes + size
                        <= BIN_BYTES.max(self.stats.reserved.current / 8) =>
            {
                self.blocks[idx as usize].state = State::Binned;
                self.bins[k].push(idx);
                self.bin_mask[k / 64] |= 1 << (k % 64);
                self.binned_bytes += size;
            }
            _ => self.make_free(idx),
        }
    }

    /// Merge every binned block back into the best-fit index.
    fn flush_bins(&mut self) {
        if self.binned_bytes == 0 {
            return;
        }
        for w in 0..self.bin_mask.len() {
            let mut bits = std::mem::take(&mut self.bin_mask[w]);
            while bits != 0 {
                let k = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                while let Some(idx) = self.bins[k].pop() {
                    self.make_free(idx);
                }
            }
        }
        debug_assert!(self.bins.iter().all(Vec::is_empty));
        self.binned_bytes = 0;
    }

    /// Serve a request of `requested` bytes. Returns the address and the block's handle.
    pub fn alloc(
        &mut self,
        requested: u64,
        backend: &dyn Backend,
        seqs: &Seqs,
        policy: &Policy,
    ) -> Result<Addr, CudaError> {
        self.alloc_on(requested, None, backend, seqs, policy)
    }

    /// `alloc` for use on `stream` when there is one: a block freed on that stream that waits
    /// for a barrier or fence serves it first (`stream_reuse`).
    pub fn alloc_on(
        &mut self,
        requested: u64,
        stream: Option<StreamKey>,
        backend: &dyn Backend,
        seqs: &Seqs,
        policy: &Policy,
    ) -> Result<Addr, CudaError> {
        self.stream_requests |= stream.is_some();
        let held = match stream {
            Some(key) if self.held_blocks > 0 => {
                self.promote(seqs);
                self.serve_held(requested, key, policy)
            }
            _ => None,
        };
        let r = match held {
            Some(served) => Ok(served),
            None => self.serve(requested, backend, seqs, policy, true),
        };
        match r {
            Ok((addr, idx)) => {
                let size = self.blocks[idx as usize].size;
                let id = stream.map_or(0, |k| self.stream_id(k));
                self.record(Kind::Alloc, requested, addr, size, id);
            }
            Err(e) => self.record(Kind::AllocFailed, requested, e.0 as u64, 0, 0),
        }
        self.enforce_threshold(backend);
        r.map(|(addr, _)| addr)
    }

    /// Requests larger than this, the largest segment so far, release the idle segments they
    /// outgrew (`release_outgrown`), and the first above `GROW_FROM` gets room to grow
    /// (`size::segment_size`); none while a release threshold is set (its releases would give
    /// the room back, and the rounding would raise the peak) or a `max_split_size` (which would
    /// hand the whole rounded block to the request).
    fn grow_above(&self, policy: &Policy) -> u64 {
        if self.threshold == u64::MAX && policy.max_split_size == u64::MAX {
            self.largest_segment
        } else {
            u64::MAX
        }
    }

    /// `alloc` without the trace and the threshold: the block's address and handle, entered in
    /// the live map if `live`.
    #[inline(always)]
    fn serve(
        &mut self,
        requested: u64,
        backend: &dyn Backend,
        seqs: &Seqs,
        policy: &Policy,
        live: bool,
    ) -> Result<(Addr, u32), CudaError> {
        let rounded = round_request(requested).ok_or(CudaError::MEMORY_ALLOCATION)?;
        let seg_size =
            segment_size(rounded, self.grow_above(policy)).ok_or(CudaError::MEMORY_ALLOCATION)?;
        let class = class_of(rounded);
        self.promote(seqs);
        let binned = Self::bin_of(rounded).and_then(|k| self.bins[k].pop());
        let idx = match binned {
            Some(idx) => {
                self.binned_bytes -= rounded;
                counted! { self.stats.hits += 1; }
                idx
            }
            None => match self.find_fit(class, rounded, policy) {
                Some(idx) => {
                    counted! { self.stats.hits += 1; }
                    self.better_fit(idx, class, rounded, backend, seqs, policy)?
                }
                None => self.refill(class, rounded, seg_size, backend, seqs, policy)?,
            },
        };
        let addr = self.take(idx, rounded, requested, policy);
        if live {
            self.live.insert(addr, idx);
        }
        Ok((addr, idx))
    }

    /// The best reusable block for a large request is `idx`, but splitting it would carve a
    /// block more than twice the request's size while at least the request's size waits for a
    /// barrier or a fence: blocks freed moments ago are usually the right size (a gradient after
    /// its activation), and shredding big blocks instead is what makes a cache grow. Make the
    /// waiting blocks reusable first (a barrier costs no host wait; a fence is taken only here
    /// and in `refill`) and fit again.
    fn better_fit(
        &mut self,
        idx: u32,
        class: Class,
        rounded: u64,
        backend: &dyn Backend,
        seqs: &Seqs,
        policy: &Policy,
    ) -> Result<u32, CudaError> {
        if class == Class::Small || self.blocks[idx as usize].size <= 2 * rounded {
            return Ok(idx);
        }
        // A failed barrier or fence leaves the waiting blocks waiting; `idx` still fits.
        let made_reusable = if self.pending_barrier_bytes >= rounded {
            self.barrier(backend, seqs).is_ok()
        } else if self.pending_fence_bytes >= rounded.max(policy.fence_bytes) {
            self.fence(backend, seqs).is_ok()
        } else {
            false
        };
        if !made_reusable {
            return Ok(idx);
        }
        Ok(self.find_fit(class, rounded, policy).unwrap_or(idx))
    }

    /// No cached block fits: make pending blocks reusable, grow, or recover from out-of-memory.
    #[inline(never)]
    fn refill(
        &mut self,
        class: Class,
        rounded: u64,
        seg_size: u64,
        backend: &dyn Backend,
        seqs: &Seqs,
        policy: &Policy,
    ) -> Result<u32, CudaError> {
        if self.binned_bytes > 0 {
            self.flush_bins();
            if let Some(idx) = self.find_fit(class, rounded, policy) {
                self.stats.hits += 1;
                return Ok(idx);
            }
        }
        // Blocks thread caches hold until a barrier or fence covers them count with the
        // device's own: the same barriers and fences cover them (they become reusable where they
        // are, and come back below).
        let lenders = if self.lent > 0 {
            self.lenders.clone()
        } else {
            None
        };
        // Another thread's cache may keep blocks of this very size: some of them serve at no
        // cost (no synchronization, no growth, the other caches keep the rest).
        if let Some(l) = lenders.as_ref().filter(|_| rounded <= super::tcache::LIMIT) {
            if l.reclaim_size(self, seqs, rounded) {
                if let Some(idx) = self.fit_after_return(class, rounded, policy) {
                    return Ok(idx);
                }
            }
        }
        let (cache_barrier, cache_fence) = lenders.as_ref().map_or((0, 0), |l| l.waiting(self));
        // A failed barrier or fence (the runtime's error is not the program's: the backend
        // cleared it) leaves the waiting blocks waiting; the pool grows instead. A sticky error
        // fails the segment's allocation below with the runtime's own code.
        // What a barrier or fence makes reusable goes to the bins first: fit from there too.
        if self.pending_barrier_bytes + cache_barrier > 0 && self.barrier(backend, seqs).is_ok() {
            if let Some(idx) = self.fit_after_return(class, rounded, policy) {
                return Ok(idx);
            }
        }
        // A fence blocks the host until the device is idle, so it is taken only once enough
        // memory waits on it; until then the pool grows instead.
        let budget = policy.fence_bytes;
        let waiting = self.pending_fence_bytes + cache_fence;
        if waiting > 0 && waiting >= budget && self.fence(backend, seqs).is_ok() {
            if let Some(idx) = self.fit_after_return(class, rounded, policy) {
                return Ok(idx);
            }
        }
        // Before the pool grows, the reusable blocks thread caches hold come back (half of
        // each), and those still waiting: what one thread keeps must not make the device grow
        // for another.
        if let Some(l) = lenders {
            if l.reclaim_ready(self, seqs) {
                if let Some(idx) = self.fit_after_return(class, rounded, policy) {
                    return Ok(idx);
                }
            }
        }
        // A segment rounded up for growth that the driver refuses is asked for again at the
        // request's own size before anything cached is given back.
        let exact = segment_size(rounded, u64::MAX).ok_or(CudaError::MEMORY_ALLOCATION)?;
        // Only a request above `GROW_FROM` can outgrow a segment that large (and a scan of
        // every segment on each new small segment would cost the replay half its speed).
        let mut outgrown = 0;
        if rounded > GROW_FROM && rounded > self.grow_above(policy) {
            outgrown = self.release_outgrown(rounded, backend, seqs);
        }
        let first = if exact < seg_size {
            &[seg_size, exact][..]
        } else {
            &[seg_size][..]
        };
        for &size in first {
            match self.new_segment(class, size, backend) {
                Ok(idx) => {
                    self.stats.misses += 1;
                    return Ok(idx);
                }
                Err(e) if e != CudaError::MEMORY_ALLOCATION => return Err(e),
                Err(_) => {}
            }
        }
        // Out of memory: take back what thread caches hold, make every cached block safe, give
        // whole free segments back, retry.
        self.stats.oom_retries += 1;
        self.limit_refused = false;
        if self.lent > 0 {
            if let Some(l) = self.lenders.clone() {
                l.reclaim(self, seqs);
                if let Some(idx) = self.fit_after_return(class, rounded, policy) {
                    self.stats.oom_recovered += 1;
                    return Ok(idx);
                }
            }
        }
        let fenced = self.pending_bytes() > 0 && self.fence(backend, seqs).is_ok();
        if fenced {
            if let Some(idx) = self.fit_after_return(class, rounded, policy) {
                self.stats.oom_recovered += 1;
                return Ok(idx);
            }
        }
        let released = outgrown + self.release_segments(backend, 0, Release::OutOfMemory);
        let mut sizes = vec![exact];
        if rounded != exact {
            // A segment larger than the request may not fit where the request alone would.
            sizes.push(rounded);
        }
        for size in sizes {
            match self.new_segment(class, size, backend) {
                Ok(idx) => {
                    self.stats.misses += 1;
                    self.stats.oom_recovered += 1;
                    return Ok(idx);
                }
                Err(e) if e != CudaError::MEMORY_ALLOCATION => return Err(e),
                Err(_) => {}
            }
        }
        self.stats.ooms += 1;
        self.sample_memory(backend);
        self.last_oom = Some(OomEvent {
            requested: rounded,
            segment: exact,
            released,
            fenced,
            limited: self.limit_refused,
            memory: self.memory,
        });
        Err(CudaError::MEMORY_ALLOCATION)
    }

    /// A block for `rounded` bytes among those just made reusable (given back by thread caches,
    /// or by a barrier or fence, which put small ones in their bins): from its bin, or with the
    /// bins merged into the index.
    fn fit_after_return(&mut self, class: Class, rounded: u64, policy: &Policy) -> Option<u32> {
        let binned = Self::bin_of(rounded).and_then(|k| self.bins[k].pop());
        let idx = match binned {
            Some(idx) => {
                self.binned_bytes -= rounded;
                idx
            }
            None => {
                self.flush_bins();
                self.find_fit(class, rounded, policy)?
            }
        };
        self.stats.hits += 1;
        Some(idx)
    }

    /// What the driver says of the device's memory now (during normal operation only).
    fn sample_memory(&mut self, backend: &dyn Backend) {
        if let Ok((free, total)) = backend.memory_info(self.device) {
            let sample = MemorySample {
                free,
                total,
                reserved: self.stats.reserved.current,
            };
            self.memory = Some(sample);
            self.memory_first.get_or_insert(sample);
        }
    }

    /// The best fit for `rounded` bytes in its pool. `max_split_size` concerns large blocks
    /// only: small ones always split (`should_split`), and a small segment's remainder must serve
    /// small requests whatever the setting (found in review: with 4 MiB small segments and a
    /// 2–4 MiB setting, every small request took a segment of its own).
    fn find_fit(&self, class: Class, rounded: u64, policy: &Policy) -> Option<u32> {
        match class {
            Class::Small => self.free_small.best_fit(rounded).map(|(_, idx)| idx),
            Class::Large => {
                let (&(size, _), &idx) = self.free_large.range((rounded, 0)..).next()?;
                may_serve(size, rounded, policy.max_split_size).then_some(idx)
            }
        }
    }

    /// Hand out the free block `idx` for a request, splitting off the remainder when allowed.
    #[inline(always)]
    fn take(&mut self, idx: u32, rounded: u64, requested: u64, policy: &Policy) -> Addr {
        if self.blocks[idx as usize].state == State::Free {
            self.unindex(idx);
        }
        let b = &self.blocks[idx as usize];
        let (addr, size, seg) = (b.addr, b.size, b.seg);
        let class = self.seg(seg).class;
        if should_split(class, size, rounded, policy.max_split_size) {
            let rest = self.new_block(Block {
                addr: addr + rounded,
                size: size - rounded,
                requested: 0,
                seg,
                prev: idx,
                next: self.blocks[idx as usize].next,
                state: State::Free,
                stamp: 0,
                wants_fence: false,
                held: false,
            });
            let next = self.blocks[idx as usize].next;
            if next != NONE {
                self.blocks[next as usize].prev = rest;
            }
            self.blocks[idx as usize].next = rest;
            self.blocks[idx as usize].size = rounded;
            self.index(rest);
        }
        self.hand_out(idx, requested)
    }

    /// Block `idx`, out of every free structure and split, goes to the program.
    #[inline(always)]
    fn hand_out(&mut self, idx: u32, requested: u64) -> Addr {
        let b = &mut self.blocks[idx as usize];
        let (addr, seg) = (b.addr, b.seg);
        b.state = State::Live;
        b.requested = requested;
        let size = b.size;
        self.seg_busy(seg);
        let s = &mut self.stats;
        s.allocated.add(size);
        counted! {
            s.allocs += 1;
            s.requested.add(requested);
            s.blocks.add(1);
            s.histogram[super::stats::histogram_bucket(requested)] += 1;
        }
        addr
    }

    /// Whether `addr` is a live block of this device.
    pub fn is_live(&self, addr: Addr) -> bool {
        self.live.contains_key(&addr)
    }

    /// Live blocks on this device.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// The program freed `addr` (`how` it did, and what its reuse must wait for). Returns false
    /// when it is not a live block of this device. `stamp` gives the device's free sequence
    /// number, taken only for a live block.
    pub fn free(
        &mut self,
        addr: Addr,
        how: FreeKind,
        need: Need,
        stamp: impl FnOnce() -> u64,
    ) -> bool {
        let Some(idx) = self.live.remove(&addr) else {
            return false;
        };
        let size = self.blocks[idx as usize].size;
        let stream = match how {
            FreeKind::Async { stream, .. } if stream != NO_STREAM => Some(stream),
            _ => None,
        };
        let id = stream.map_or(0, |k| self.stream_id(k));
        self.record(Kind::Free, addr, need as u64, size, how.code() | id << 2);
        self.free_block(idx, need, stamp());
        let holds = self.stream_reuse && self.stream_requests && need != Need::Nothing;
        if let (Some(key), true) = (stream, holds) {
            self.hold_for_stream(idx, key);
        }
        true
    }

    /// The trace's number for `stream` (0 when not tracing: no stream is numbered 0).
    fn stream_id(&mut self, stream: StreamKey) -> u16 {
        if self.trace.is_none() {
            return 0;
        }
        if let Some(&id) = self.stream_ids.get(&stream) {
            return id;
        }
        // Numbers 1..TRACE_STREAMS - 1 name one stream each; the map stops growing there.
        let id = self.stream_ids.len() as u64 + 1;
        if id >= TRACE_STREAMS as u64 {
            return TRACE_STREAMS;
        }
        self.stream_ids.insert(stream, id as u16);
        id as u16
    }

    // Stream-ordered reuse. A block freed on a stream, pending, is also held for that stream:
    // merged with pending neighbours held for it (with the later stamp), so that a larger
    // request on the stream can take them together, and taken by `serve_held`, whose remainder
    // stays held and pending. A barrier or fence that covers it makes it reusable by all
    // (`recycle`, which lets it go).

    /// Hold pending block `idx`, freed on `stream`, for reuse on that stream.
    fn hold_for_stream(&mut self, mut idx: u32, stream: StreamKey) {
        let (stamp, fence) = {
            let b = &self.blocks[idx as usize];
            debug_assert_eq!(b.state, State::Pending);
            (b.stamp, b.wants_fence)
        };
        // A neighbour joins when it is held for the same stream, or free when the block waits
        // for a barrier: free memory next to it becomes the stream's until then (everyone's
        // again after a barrier, which another stream's request takes at no host wait before
        // the pool grows), so that the stream's larger requests find it whole, as in a pool
        // that reuses at once. Not for a fence, which the pool takes only at its budget: other
        // streams would grow the pool instead. Nor in small segments: a stream that frees and
        // allocates small tensors in turn would merge and split the segment's rest on every
        // pair, and small requests rarely need their neighbours (the H200 trace's figures are the
        // same either way).
        let joins = |p: &DevicePool, n: u32| {
            if n == NONE {
                return None;
            }
            let b = &p.blocks[n as usize];
            match b.state {
                State::Free if !fence && p.seg(b.seg).class == Class::Large => Some(b.size),
                State::Pending
                    if b.held && p.held_by[n as usize] == stream && b.wants_fence == fence =>
                {
                    Some(0)
                }
                _ => None,
            }
        };
        let prev = self.blocks[idx as usize].prev;
        let next = self.blocks[idx as usize].next;
        let (join_prev, join_next) = (joins(self, prev), joins(self, next));
        // The merged block waits for the latest free among its parts: a split's remainder
        // (`serve_held`) may sit next to a block freed on its stream after it.
        let later = [(prev, join_prev), (next, join_next)]
            .into_iter()
            .filter(|&(_, j)| j == Some(0))
            .map(|(n, _)| self.blocks[n as usize].stamp)
            .max()
            .unwrap_or(0);
        if join_prev.is_some() || join_next.is_some() {
            // One new queue entry for the merged block; the old ones go stale (their stamp or
            // their block no longer matches).
            if let Some(free) = join_prev {
                self.release_neighbour(prev, free);
                self.absorb_next(prev);
                idx = prev;
            }
            if let Some(free) = join_next {
                self.release_neighbour(next, free);
                self.absorb_next(idx);
            }
            let grown = join_prev.unwrap_or(0) + join_next.unwrap_or(0);
            let stamp = stamp.max(later);
            self.set_pending(idx, stamp, fence);
            self.queue_waiting(idx, stamp, fence, grown);
        }
        self.blocks[idx as usize].held = true;
        if self.held_by.len() <= idx as usize {
            self.held_by.resize(self.blocks.len(), NO_STREAM);
        }
        self.held_by[idx as usize] = stream;
        self.held_blocks += 1;
        let key = self.held_key(idx);
        self.held.entry(stream).or_default().insert(key);
        self.compact_queues();
    }

    /// Stream-ordered reuse leaves stale queue entries behind (a held block taken, merged or
    /// split), which only a barrier or fence would clear, and a stream served by the blocks it
    /// freed may never need one: once the queues have doubled since they were last compacted,
    /// keep only the entries of blocks still waiting (in order).
    fn compact_queues(&mut self) {
        if self.pending_fence.len() + self.pending_barrier.len() < self.compact_at {
            return;
        }
        let blocks = &self.blocks;
        let waits = |fence: bool| {
            move |&(i, stamp): &(u32, u64)| {
                let b = &blocks[i as usize];
                b.state == State::Pending && b.stamp == stamp && b.wants_fence == fence
            }
        };
        self.pending_fence.retain(waits(true));
        self.pending_barrier.retain(waits(false));
        let left = self.pending_fence.len() + self.pending_barrier.len();
        self.compact_at = (2 * left).max(COMPACT_FROM);
    }

    /// Entries in the fence and barrier queues (tests).
    #[cfg(test)]
    pub fn queue_lens(&self) -> (usize, usize) {
        (self.pending_fence.len(), self.pending_barrier.len())
    }

    /// Neighbour `n` of a block being held leaves its index (`free`: its size, it was free) or
    /// its stream, to be absorbed.
    fn release_neighbour(&mut self, n: u32, free: u64) {
        if free > 0 {
            self.unindex(n);
        } else {
            self.leave_stream(n);
        }
    }

    /// Block `idx` is no longer held for its stream (if it was). On every recycle: the check
    /// inlined, the work apart.
    #[inline(always)]
    fn leave_stream(&mut self, idx: u32) {
        if self.blocks[idx as usize].held {
            self.unhold(idx);
        }
    }

    /// Where a held block stands in its stream's set: (in a large segment, size, handle).
    fn held_key(&self, idx: u32) -> (bool, u64, u32) {
        let b = &self.blocks[idx as usize];
        (self.seg(b.seg).class == Class::Large, b.size, idx)
    }

    #[inline(never)]
    fn unhold(&mut self, idx: u32) {
        self.blocks[idx as usize].held = false;
        self.held_blocks -= 1;
        let key = self.held_key(idx);
        let stream = std::mem::replace(&mut self.held_by[idx as usize], NO_STREAM);
        if let Some(set) = self.held.get_mut(&stream) {
            set.remove(&key);
            if set.is_empty() && self.held.len() > EMPTY_HELD_SETS {
                self.held.remove(&stream);
            }
        }
    }

    /// Serve `requested` bytes on `stream` from the smallest block held for it that may serve
    /// it (the rules of `find_fit`), if any: live, with its address in the live map. Returns
    /// the address and the block's handle.
    fn serve_held(
        &mut self,
        requested: u64,
        stream: StreamKey,
        policy: &Policy,
    ) -> Option<(Addr, u32)> {
        let rounded = round_request(requested)?;
        let class = class_of(rounded);
        let large = class == Class::Large;
        let &(_, size, idx) = self
            .held
            .get(&stream)?
            .range((large, rounded, 0)..=(large, u64::MAX, u32::MAX))
            .next()?;
        if large && !may_serve(size, rounded, policy.max_split_size) {
            return None;
        }
        // The best fit of all: a reusable block that fits better serves instead.
        let exact = Self::bin_of(rounded).is_some_and(|k| !self.bins[k].is_empty());
        if exact
            || self
                .find_fit(class, rounded, policy)
                .is_some_and(|i| self.blocks[i as usize].size < size)
        {
            return None;
        }
        self.leave_stream(idx);
        let (stamp, fence, seg, next) = {
            let b = &self.blocks[idx as usize];
            (b.stamp, b.wants_fence, b.seg, b.next)
        };
        self.unpend(idx);
        if should_split(class, size, rounded, policy.max_split_size) {
            // The remainder was freed with the block: still pending, still held. Its queue
            // entry goes behind later ones: `promote` stops at the first entry not covered, so
            // an older entry behind newer ones is made reusable late, never early.
            let rest = self.new_block(Block {
                addr: self.blocks[idx as usize].addr + rounded,
                size: size - rounded,
                requested: 0,
                seg,
                prev: idx,
                next,
                state: State::Live,
                stamp,
                wants_fence: fence,
                held: false,
            });
            if next != NONE {
                self.blocks[next as usize].prev = rest;
            }
            self.blocks[idx as usize].next = rest;
            self.blocks[idx as usize].size = rounded;
            self.after_free(rest, if fence { Need::Fence } else { Need::Barrier }, stamp);
            self.hold_for_stream(rest, stream);
        }
        counted! {
            self.stats.hits += 1;
            self.stats.stream_hits += 1;
        }
        let addr = self.hand_out(idx, requested);
        self.live.insert(addr, idx);
        self.compact_queues();
        Some((addr, idx))
    }

    /// Pending block `idx` stops waiting (its queue entry goes stale).
    fn unpend(&mut self, idx: u32) {
        let b = &mut self.blocks[idx as usize];
        debug_assert_eq!(b.state, State::Pending);
        b.state = State::Live;
        let (fence, size) = (b.wants_fence, b.size);
        *self.waiting_bytes_mut(fence) -= size;
    }

    #[cfg_attr(not(feature = "stats"), allow(unused_variables))]
    fn free_block(&mut self, idx: u32, need: Need, stamp: u64) {
        let b = &mut self.blocks[idx as usize];
        debug_assert_eq!(b.state, State::Live);
        let (size, requested, seg) = (b.size, b.requested, b.seg);
        b.requested = 0;
        self.seg_quiet(seg);
        let s = &mut self.stats;
        s.allocated.sub(size);
        counted! {
            s.frees += 1;
            s.requested.sub(requested);
            s.blocks.sub(1);
        }
        self.after_free(idx, need, stamp);
    }

    /// A block the program no longer uses: reusable now, or once `need` is met.
    #[inline(always)]
    fn after_free(&mut self, idx: u32, need: Need, stamp: u64) {
        let size = self.blocks[idx as usize].size;
        match need {
            Need::Nothing => self.recycle(idx),
            Need::Barrier | Need::Fence => {
                let fence = need == Need::Fence;
                self.set_pending(idx, stamp, fence);
                self.queue_waiting(idx, stamp, fence, size);
            }
        }
    }

    /// Pending block `idx` (stamped `stamp`) waits in the queue of a fence or of a barrier;
    /// `bytes` more wait there.
    #[inline(always)]
    fn queue_waiting(&mut self, idx: u32, stamp: u64, fence: bool, bytes: u64) {
        *self.waiting_bytes_mut(fence) += bytes;
        if fence {
            self.pending_fence.push_back((idx, stamp));
        } else {
            self.pending_barrier.push_back((idx, stamp));
        }
    }

    /// The bytes waiting for a fence, or for a barrier.
    #[inline(always)]
    fn waiting_bytes_mut(&mut self, fence: bool) -> &mut u64 {
        if fence {
            &mut self.pending_fence_bytes
        } else {
            &mut self.pending_barrier_bytes
        }
    }

    // Lending to thread caches (`tcache.rs`). A lent block stays out of the live map and the
    // free structures; the device counts it as allocated, requested and live at its full size
    // (so its peaks include what thread caches hold) until it comes back through `take_back`
    // or `adopt`. Moving blocks in and out of the caches leaves the gauges' totals alone: the
    // thread caches count the program's own allocations and frees.

    /// Serve `requested` bytes like `alloc` but lend the block to a thread cache, and lend up to
    /// `extra` more reusable blocks of the same size from its bin into `extras`. Returns the
    /// block's address, handle and size (a large block may be larger than the request's
    /// rounding). Never called while tracing.
    #[cfg_attr(not(feature = "stats"), allow(unused_variables))]
    pub fn alloc_lent(
        &mut self,
        requested: u64,
        backend: &dyn Backend,
        seqs: &Seqs,
        policy: &Policy,
        extra: usize,
        extras: &mut Extras,
    ) -> Result<(Addr, u32, u64), CudaError> {
        debug_assert!(self.trace.is_none(), "thread caches are off while tracing");
        let r = self.serve(requested, backend, seqs, policy, false);
        self.enforce_threshold(backend);
        let (_, idx) = r?;
        let b = &mut self.blocks[idx as usize];
        let (addr, size, req) = (b.addr, b.size, b.requested);
        b.state = State::Lent;
        b.requested = size;
        self.lent += 1;
        self.stats.thread_cache_borrowed += 1;
        counted! { self.stats.requested.lend(size - req); }
        if let Some(k) = Self::bin_of(size) {
            for _ in 0..extra.min(EXTRAS) {
                let Some(i) = self.bins[k].pop() else { break };
                self.binned_bytes -= size;
                let b = &mut self.blocks[i as usize];
                b.state = State::Lent;
                b.requested = size;
                let (a, seg) = (b.addr, b.seg);
                self.seg_busy(seg);
                self.lent += 1;
                let s = &mut self.stats;
                s.thread_cache_borrowed += 1;
                s.allocated.lend(size);
                counted! {
                    s.requested.lend(size);
                    s.blocks.lend(1);
                }
                extras.push((a, i));
            }
        }
        Ok((addr, idx, size))
    }

    /// A thread cache gives lent block `idx` back, free: reusable once `need` is met. `stamp`
    /// gives the free sequence number (taken now, later than the program's free, which only
    /// makes the wait longer).
    pub fn take_back(&mut self, idx: u32, need: Need, stamp: impl FnOnce() -> u64) {
        let b = &mut self.blocks[idx as usize];
        debug_assert_eq!(b.state, State::Lent);
        let (size, seg) = (b.size, b.seg);
        b.requested = 0;
        self.lent -= 1;
        self.seg_quiet(seg);
        let s = &mut self.stats;
        s.thread_cache_returned += 1;
        s.allocated.unlend(size);
        counted! {
            s.requested.unlend(size);
            s.blocks.unlend(1);
        }
        let stamp = if need == Need::Nothing { 0 } else { stamp() };
        self.after_free(idx, need, stamp);
    }

    /// A lent block the program still holds comes back as an ordinary live block (its thread
    /// cache's thread exited).
    #[cfg_attr(not(feature = "stats"), allow(unused_variables))]
    pub fn adopt(&mut self, idx: u32, requested: u64) {
        let b = &mut self.blocks[idx as usize];
        debug_assert_eq!(b.state, State::Lent);
        let (addr, size) = (b.addr, b.size);
        b.state = State::Live;
        b.requested = requested;
        self.lent -= 1;
        counted! { self.stats.requested.unlend(size - requested); }
        self.live.insert(addr, idx);
    }

    /// Lent block `idx`, as the live block the program holds with `requested` bytes.
    pub fn lent_block(&self, idx: u32, requested: u64) -> Option<LiveBlock> {
        let b = self.blocks.get(idx as usize)?;
        (b.state == State::Lent).then(|| LiveBlock {
            addr: b.addr,
            size: b.size,
            requested,
            segment_addr: self.seg(b.seg).addr,
        })
    }

    /// Whether `idx` is a block lent at `addr` (for the thread caches' own checks).
    pub fn is_lent(&self, idx: u32, addr: Addr) -> bool {
        self.blocks
            .get(idx as usize)
            .is_some_and(|b| b.state == State::Lent && b.addr == addr)
    }

    /// Blocks lent to thread caches.
    pub fn lent_count(&self) -> u64 {
        self.lent
    }

    fn set_pending(&mut self, idx: u32, stamp: u64, wants_fence: bool) {
        let b = &mut self.blocks[idx as usize];
        b.state = State::Pending;
        b.stamp = stamp;
        b.wants_fence = wants_fence;
    }

    /// Make pending blocks reusable that a fence or barrier (ours or the program's) has covered.
    pub fn promote(&mut self, seqs: &Seqs) {
        let fenced = seqs.fenced.load(Ordering::Acquire);
        let barriered = seqs.barriered.load(Ordering::Acquire).max(fenced);
        if fenced > self.fenced_seen || barriered > self.barriered_seen {
            // The program synchronized since the last operation (the pool's own fences and
            // barriers update the seen values themselves).
            if fenced > self.fenced_seen
                && self.pending_fence.front().is_some_and(|&(_, s)| s < fenced)
            {
                self.stats.observed_fences += 1;
            }
            self.fenced_seen = fenced;
            self.barriered_seen = barriered;
            self.record(Kind::Observe, fenced, barriered, 0, 0);
        }
        while let Some(&(idx, stamp)) = self.pending_fence.front() {
            if stamp >= fenced {
                break;
            }
            self.pending_fence.pop_front();
            if self.is_pending(idx, stamp) {
                self.pending_fence_bytes -= self.blocks[idx as usize].size;
                self.recycle(idx);
            }
        }
        while let Some(&(idx, stamp)) = self.pending_barrier.front() {
            if stamp >= barriered {
                break;
            }
            self.pending_barrier.pop_front();
            if self.is_pending(idx, stamp) {
                self.pending_barrier_bytes -= self.blocks[idx as usize].size;
                self.recycle(idx);
            }
        }
    }

    /// Queue entries go stale when their segment is released; the stamp tells them apart.
    fn is_pending(&self, idx: u32, stamp: u64) -> bool {
        let b = &self.blocks[idx as usize];
        b.state == State::Pending && b.stamp == stamp
    }

    /// Wait for the whole device, then make every pending block reusable.
    pub fn fence(&mut self, backend: &dyn Backend, seqs: &Seqs) -> Result<(), CudaError> {
        let at = seqs.before_sync();
        let covered = at.freed;
        let t = Instant::now();
        backend.fence(self.device)?;
        let ns = t.elapsed().as_nanos() as u64;
        self.stats.fences += 1;
        self.stats.fence_ns += ns;
        self.record(Kind::Fence, ns, 0, 0, 0);
        let fenced = seqs.fenced_at(at);
        if fenced == covered {
            self.fenced_seen = self.fenced_seen.max(covered);
            self.barriered_seen = self.barriered_seen.max(covered);
        }
        self.promote(seqs);
        Ok(())
    }

    fn barrier(&mut self, backend: &dyn Backend, seqs: &Seqs) -> Result<(), CudaError> {
        let at = seqs.before_sync();
        let covered = at.freed;
        backend.barrier(self.device)?;
        self.stats.barriers += 1;
        self.record(Kind::Barrier, 0, 0, 0, 0);
        let barriered = seqs.barriered_at(at);
        if barriered == covered {
            self.barriered_seen = self.barriered_seen.max(covered);
        }
        self.promote(seqs);
        Ok(())
    }

    /// Put block `idx` in the best-fit index, merged with free neighbours.
    fn make_free(&mut self, mut idx: u32) {
        let prev = self.blocks[idx as usize].prev;
        if prev != NONE && self.blocks[prev as usize].state == State::Free {
            self.unindex(prev);
            self.absorb_next(prev);
            idx = prev;
        }
        let next = self.blocks[idx as usize].next;
        if next != NONE && self.blocks[next as usize].state == State::Free {
            self.unindex(next);
            self.absorb_next(idx);
        }
        self.blocks[idx as usize].state = State::Free;
        self.index(idx);
    }

    /// Merge the block after `idx` into `idx`.
    fn absorb_next(&mut self, idx: u32) {
        let next = self.blocks[idx as usize].next;
        let (size, after) = {
            let n = &self.blocks[next as usize];
            (n.size, n.next)
        };
        self.blocks[idx as usize].size += size;
        self.blocks[idx as usize].next = after;
        if after != NONE {
            self.blocks[after as usize].prev = idx;
        }
        self.drop_block(next);
    }

    fn index(&mut self, idx: u32) {
        let b = &self.blocks[idx as usize];
        let (size, addr) = (b.size, b.addr);
        match self.seg(b.seg).class {
            Class::Small => self.free_small.insert(idx, size),
            Class::Large => {
                self.free_large.insert((size, addr), idx);
            }
        }
    }

    fn unindex(&mut self, idx: u32) {
        let b = &self.blocks[idx as usize];
        let (size, addr) = (b.size, b.addr);
        let removed = match self.seg(b.seg).class {
            Class::Small => self.free_small.remove(idx, size),
            Class::Large => self.free_large.remove(&(size, addr)) == Some(idx),
        };
        debug_assert!(removed, "free block {addr:#x} not indexed");
    }

    fn new_block(&mut self, b: Block) -> u32 {
        match self.vacant_blocks.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn drop_block(&mut self, idx: u32) {
        let b = &mut self.blocks[idx as usize];
        b.state = State::Vacant;
        b.prev = NONE;
        b.next = NONE;
        self.vacant_blocks.push(idx);
    }

    fn seg(&self, i: u32) -> &Segment {
        self.segments[i as usize]
            .as_ref()
            .expect("block in a released segment")
    }

    fn seg_mut(&mut self, i: u32) -> &mut Segment {
        self.segments[i as usize]
            .as_mut()
            .expect("block in a released segment")
    }

    /// Segment `i` gets a live (or lent) block.
    #[inline(always)]
    fn seg_busy(&mut self, i: u32) {
        let s = self.seg_mut(i);
        s.live += 1;
        if s.live == 1 {
            let size = s.size;
            self.idle_bytes -= size;
        }
    }

    /// Segment `i` loses a live (or lent) block.
    #[inline(always)]
    fn seg_quiet(&mut self, i: u32) {
        let s = self.seg_mut(i);
        s.live -= 1;
        if s.live == 0 {
            let size = s.size;
            self.idle_bytes += size;
        }
    }

    /// Ask the driver for a segment; returns its single free block, already indexed.
    fn new_segment(
        &mut self,
        class: Class,
        size: u64,
        backend: &dyn Backend,
    ) -> Result<u32, CudaError> {
        if self.stats.reserved.current.saturating_add(size) > self.limit {
            self.limit_refused = true;
            self.stats.limit_refusals += 1;
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        let t = Instant::now();
        let r = backend.alloc_segment(self.device, size);
        self.stats.real_mallocs += 1;
        self.stats.real_malloc_ns += t.elapsed().as_nanos() as u64;
        let addr = match r {
            Ok(addr) => addr,
            Err(e) => {
                self.record(Kind::SegmentRefused, size, e.0 as u64, 0, 0);
                return Err(e);
            }
        };
        self.record(Kind::SegmentAlloc, addr, size, 0, 0);
        if class == Class::Large {
            self.largest_segment = self.largest_segment.max(size);
        }
        self.stats.reserved.add(size);
        self.stats.segments.add(1);
        self.idle_bytes += size;
        self.sample_memory(backend);
        let seg = Segment {
            addr,
            size,
            class,
            live: 0,
            first: NONE,
        };
        let si = match self.vacant_segments.pop() {
            Some(i) => {
                self.segments[i as usize] = Some(seg);
                i
            }
            None => {
                self.segments.push(Some(seg));
                (self.segments.len() - 1) as u32
            }
        };
        let idx = self.new_block(Block {
            addr,
            size,
            requested: 0,
            seg: si,
            prev: NONE,
            next: NONE,
            state: State::Free,
            stamp: 0,
            wants_fence: false,
            held: false,
        });
        self.seg_mut(si).first = idx;
        self.by_addr.insert(addr, si);
        self.index(idx);
        Ok(idx)
    }

    /// Give whole free segments back, largest first, until the cache holds at most `keep` bytes.
    /// Returns the bytes released.
    pub fn release_segments(&mut self, backend: &dyn Backend, keep: u64, why: Release) -> u64 {
        if self.cached() <= keep || self.idle_bytes == 0 {
            return 0;
        }
        self.flush_bins();
        self.release_idle(backend, keep, why, |_| true)
    }

    /// A request of `rounded` bytes, larger than every segment the device has had, is about to
    /// get a segment of its own: the idle segments of at least `OUTGROWN_FROM` it outgrew go back
    /// first. They cannot serve it, and a program whose largest buffer keeps growing (an inference
    /// server's logits as prompts get longer) would otherwise hold every earlier size at once:
    /// reserved memory follows the largest buffer instead of the sum of their sizes. Smaller
    /// segments, which later requests are likelier to reuse, stay. Whole segments only; large
    /// segments are never binned. Returns the bytes released.
    fn release_outgrown(&mut self, rounded: u64, backend: &dyn Backend, seqs: &Seqs) -> u64 {
        let outgrown =
            |s: &Segment| s.class == Class::Large && s.size >= OUTGROWN_FROM && s.size < rounded;
        // Nothing to outgrow: the thread caches are not emptied for nothing.
        if self.largest_segment < OUTGROWN_FROM || !self.segments.iter().flatten().any(outgrown) {
            return 0;
        }
        // Free blocks thread caches hold (medium blocks carved from a large segment's room)
        // would keep a segment busy: they come back first.
        if self.lent > 0 {
            if let Some(l) = self.lenders.clone() {
                l.reclaim(self, seqs);
            }
        }
        self.release_idle(backend, 0, Release::Outgrown, outgrown)
    }

    /// Release idle segments (no live or lent block) that `pick` accepts, largest first, until
    /// the cache holds at most `keep` bytes. Binned blocks must have been merged back.
    fn release_idle(
        &mut self,
        backend: &dyn Backend,
        keep: u64,
        why: Release,
        pick: impl Fn(&Segment) -> bool,
    ) -> u64 {
        if self.idle_bytes == 0 {
            return 0;
        }
        let mut idle: Vec<(u64, u32)> = self
            .segments
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.as_ref()
                    .filter(|s| s.live == 0 && pick(s))
                    .map(|s| (s.size, i as u32))
            })
            .collect();
        idle.sort_unstable_by(|a, b| b.cmp(a));
        let mut released = 0;
        for (size, si) in idle {
            if self.cached() <= keep {
                break;
            }
            if self.release_segment(si, backend, why).is_err() {
                break;
            }
            released += size;
            let s = &mut self.stats;
            match why {
                Release::Threshold => {
                    s.threshold_releases += 1;
                    s.threshold_released_bytes += size;
                }
                Release::EmptyCache => {
                    s.empty_cache_releases += 1;
                    s.empty_cache_released_bytes += size;
                }
                Release::OutOfMemory => s.oom_released_bytes += size,
                Release::Outgrown => {
                    s.outgrown_releases += 1;
                    s.outgrown_released_bytes += size;
                }
            }
        }
        if released > 0 {
            // Drop the queue entries of blocks that went with their segments.
            let blocks = &self.blocks;
            let valid = |&(i, st): &(u32, u64)| {
                let b = &blocks[i as usize];
                b.state == State::Pending && b.stamp == st
            };
            self.pending_fence.retain(valid);
            self.pending_barrier.retain(valid);
        }
        released
    }

    /// Release threshold check: the next pool operation or program synchronization calls it.
    pub fn enforce_threshold(&mut self, backend: &dyn Backend) {
        if self.cached() > self.threshold {
            self.release_segments(backend, self.threshold, Release::Threshold);
        }
    }

    /// A synchronization the program made: reuse what it covered, apply the threshold.
    pub fn sync_point(&mut self, backend: &dyn Backend, seqs: &Seqs) {
        self.promote(seqs);
        self.record(Kind::SyncPoint, 0, 0, 0, 0);
        self.enforce_threshold(backend);
    }

    /// An explicit request to give every whole free segment back. Returns the bytes released.
    pub fn empty_cache(&mut self, backend: &dyn Backend, seqs: &Seqs) -> u64 {
        self.promote(seqs);
        self.record(Kind::EmptyCache, 0, 0, 0, 0);
        self.release_segments(backend, 0, Release::EmptyCache)
    }

    /// Set the most bytes this pool may reserve (applied to the next segment).
    pub fn set_limit(&mut self, bytes: u64) {
        self.limit = bytes;
        self.record(Kind::Limit, bytes, 0, 0, 0);
    }

    /// Bytes of segments that hold no live or lent block: what a release could give back now.
    pub fn idle_bytes(&self) -> u64 {
        self.idle_bytes
    }

    /// Change the release threshold (applied at the next operation).
    pub fn set_threshold(&mut self, bytes: u64) {
        self.threshold = bytes;
        self.record(Kind::Threshold, bytes, 0, 0, 0);
    }

    fn release_segment(
        &mut self,
        si: u32,
        backend: &dyn Backend,
        why: Release,
    ) -> Result<(), CudaError> {
        let (addr, size, first) = {
            let s = self.seg(si);
            debug_assert_eq!(s.live, 0, "released a segment in use");
            (s.addr, s.size, s.first)
        };
        let t = Instant::now();
        let r = backend.free_segment(self.device, addr);
        self.stats.real_frees += 1;
        self.stats.real_free_ns += t.elapsed().as_nanos() as u64;
        r?;
        self.record(Kind::SegmentFree, addr, size, 0, why as u16);
        let mut idx = first;
        while idx != NONE {
            let next = self.blocks[idx as usize].next;
            match self.blocks[idx as usize].state {
                State::Free => self.unindex(idx),
                State::Pending => {
                    self.leave_stream(idx);
                    let b = &self.blocks[idx as usize];
                    let (fence, size) = (b.wants_fence, b.size);
                    *self.waiting_bytes_mut(fence) -= size;
                }
                State::Live | State::Lent | State::Vacant | State::Binned => {
                    debug_assert!(false, "released a segment in use or binned")
                }
            }
            self.drop_block(idx);
            idx = next;
        }
        self.by_addr.remove(&addr);
        self.segments[si as usize] = None;
        self.vacant_segments.push(si);
        self.idle_bytes -= size;
        self.stats.reserved.sub(size);
        self.stats.segments.sub(1);
        Ok(())
    }

    /// `cudaDeviceReset` freed everything: forget it all (the driver already took it back).
    pub fn forget_all(&mut self) {
        self.record(Kind::Reset, 0, 0, 0, 0);
        // Blocks still lent once the caches are settled are on their way back from a thread's
        // cache: freed by the program (its cache counted that free already) or free blocks a
        // cache gives back. None is the program's any more, so none counts as freed here (found
        // in review: a free racing the reset counted twice in the totals). (A cache hands out
        // what it borrows before the device's lock goes: none is on its way there.)
        for b in self.blocks.iter().filter(|b| b.state == State::Lent) {
            let s = &mut self.stats;
            s.allocated.unlend(b.size);
            counted! {
                s.requested.unlend(b.requested);
                s.blocks.unlend(1);
            }
        }
        let s = &mut self.stats;
        s.resets += 1;
        s.requested.sub(s.requested.current);
        s.allocated.sub(s.allocated.current);
        s.blocks.sub(s.blocks.current);
        s.reserved.sub(s.reserved.current);
        s.segments.sub(s.segments.current);
        self.blocks.clear();
        self.vacant_blocks.clear();
        self.live.clear();
        self.bins.iter_mut().for_each(Vec::clear);
        self.bin_mask = [0; BINS / 64];
        self.binned_bytes = 0;
        self.segments.clear();
        self.vacant_segments.clear();
        self.by_addr.clear();
        self.free_small.clear();
        self.free_large.clear();
        self.pending_fence.clear();
        self.pending_barrier.clear();
        self.pending_fence_bytes = 0;
        self.pending_barrier_bytes = 0;
        self.held.clear();
        self.held_by.clear();
        self.held_blocks = 0;
        self.largest_segment = 0;
        self.idle_bytes = 0;
        self.lent = 0;
        // The reset destroyed the context too: the next sample is the new baseline of what is
        // in use outside the pool.
        self.memory_first = None;
        self.generation += 1;
    }

    /// The segment holding `addr`, as (base, size).
    pub fn segment_containing(&self, addr: Addr) -> Option<(Addr, u64)> {
        let (_, &si) = self.by_addr.range(..=addr).next_back()?;
        let s = self.seg(si);
        (addr < s.addr + s.size).then_some((s.addr, s.size))
    }

    /// The live block at `addr`.
    pub fn live_block_at(&self, addr: Addr) -> Option<LiveBlock> {
        self.live_block(*self.live.get(&addr)?)
    }

    /// Live block `idx` as the pool sees it.
    fn live_block(&self, idx: u32) -> Option<LiveBlock> {
        let b = self.blocks.get(idx as usize)?;
        (b.state == State::Live).then(|| LiveBlock {
            addr: b.addr,
            size: b.size,
            requested: b.requested,
            segment_addr: self.seg(b.seg).addr,
        })
    }

    /// Every live block (for the leak list at exit).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        (0..self.blocks.len() as u32)
            .filter_map(|i| self.live_block(i))
            .collect()
    }

    /// Check every structural invariant; tests call it after each step.
    pub fn check(&self) -> Result<(), String> {
        let mut reserved = 0;
        let mut allocated = 0;
        let mut requested = 0;
        let mut pending = 0;
        let mut free_count = 0;
        let mut binned = 0;
        let mut lent = 0;
        let mut idle = 0;
        let mut held = 0;
        for (si, s) in self.segments.iter().enumerate() {
            let Some(s) = s else { continue };
            reserved += s.size;
            let mut at = s.addr;
            let mut idx = s.first;
            let mut prev = NONE;
            let mut live = 0;
            let mut prev_free = false;
            while idx != NONE {
                let b = &self.blocks[idx as usize];
                if b.addr != at || b.seg as usize != si || b.prev != prev {
                    return Err(format!("segment {si}: block chain broken at {:#x}", b.addr));
                }
                if b.addr % 512 != 0 || b.size == 0 || b.size % 512 != 0 {
                    return Err(format!("block {:#x}+{} misaligned", b.addr, b.size));
                }
                match b.state {
                    State::Live => {
                        live += 1;
                        allocated += b.size;
                        requested += b.requested;
                    }
                    State::Free => {
                        free_count += 1;
                        if prev_free {
                            return Err(format!("adjacent free blocks at {:#x}", b.addr));
                        }
                        let indexed = match s.class {
                            Class::Small => self.free_small.contains(idx, b.size),
                            Class::Large => self.free_large.get(&(b.size, b.addr)) == Some(&idx),
                        };
                        if !indexed {
                            return Err(format!("free block {:#x} not indexed", b.addr));
                        }
                    }
                    State::Lent => {
                        live += 1;
                        lent += 1;
                        allocated += b.size;
                        requested += b.size;
                    }
                    State::Pending => {
                        pending += b.size;
                        if b.held {
                            held += 1;
                            let key = self.held_key(idx);
                            let set = self
                                .held_by
                                .get(idx as usize)
                                .and_then(|k| self.held.get(k));
                            if !set.is_some_and(|h| h.contains(&key)) {
                                return Err(format!("held block {:#x} not indexed", b.addr));
                            }
                        }
                    }
                    State::Binned => binned += b.size,
                    State::Vacant => return Err("vacant block in a segment".into()),
                }
                prev_free = b.state == State::Free;
                at += b.size;
                prev = idx;
                idx = b.next;
            }
            if at != s.addr + s.size {
                return Err(format!(
                    "segment {si}: blocks cover {} of {}",
                    at - s.addr,
                    s.size
                ));
            }
            if live != s.live {
                return Err(format!("segment {si}: live count {} != {live}", s.live));
            }
            if live == 0 {
                idle += s.size;
            }
        }
        if idle != self.idle_bytes {
            return Err(format!("idle segments {idle} != {}", self.idle_bytes));
        }
        let st = &self.stats;
        if free_count != self.free_small.len() + self.free_large.len() {
            return Err("index holds blocks that are not free".into());
        }
        if reserved != st.reserved.current
            || allocated != st.allocated.current
            || requested != st.requested.current
        {
            return Err(format!(
                "accounting: reserved {reserved}/{}, allocated {allocated}/{}, requested {requested}/{}",
                st.reserved.current, st.allocated.current, st.requested.current
            ));
        }
        if binned != self.binned_bytes
            || binned
                != self
                    .bins
                    .iter()
                    .flatten()
                    .map(|&i| self.blocks[i as usize].size)
                    .sum()
        {
            return Err(format!("binned {binned} != {}", self.binned_bytes));
        }
        if lent != self.lent {
            return Err(format!("lent {lent} != {}", self.lent));
        }
        if self.live.len() as u64 + lent != st.blocks.current
            || self
                .live
                .iter()
                .any(|(&a, &i)| self.blocks[i as usize].addr != a)
        {
            return Err("live map disagrees with the blocks".into());
        }
        if held != self.held.values().map(BTreeSet::len).sum::<usize>() || held != self.held_blocks
        {
            return Err("blocks held for streams disagree with the blocks".into());
        }
        if pending != self.pending_bytes() {
            return Err(format!("pending {pending} != {}", self.pending_bytes()));
        }
        self.check_waiting()
    }

    /// Pending blocks: the bytes waiting for a fence and for a barrier, and each block's entry in
    /// the queue of what it waits for (and none in the other). (The blocks held for streams are
    /// checked in `check`: every held block's key is in its stream's set, and the sets hold no
    /// more entries than there are held blocks, which `held_blocks` counts.)
    fn check_waiting(&self) -> Result<(), String> {
        let entries = |q: &VecDeque<(u32, u64)>| q.iter().copied().collect::<HashSet<_>>();
        let (in_fence, in_barrier) = (entries(&self.pending_fence), entries(&self.pending_barrier));
        let (mut fence, mut barrier) = (0, 0);
        for (i, b) in self.blocks.iter().enumerate() {
            if b.state != State::Pending {
                continue;
            }
            let entry = (i as u32, b.stamp);
            let (own, other) = if b.wants_fence {
                fence += b.size;
                (&in_fence, &in_barrier)
            } else {
                barrier += b.size;
                (&in_barrier, &in_fence)
            };
            if !own.contains(&entry) || other.contains(&entry) {
                return Err(format!("pending block {:#x}: queue entries wrong", b.addr));
            }
        }
        if fence != self.pending_fence_bytes || barrier != self.pending_barrier_bytes {
            return Err(format!(
                "waiting for a fence {fence}/{}, for a barrier {barrier}/{}",
                self.pending_fence_bytes, self.pending_barrier_bytes
            ));
        }
        Ok(())
    }
}
