//! One device's pool: segments from the driver carved into blocks, best fit over cached free
//! blocks, split and merge, freed blocks that wait for a fence or barrier before reuse, and
//! release of whole free segments. Single-threaded: the caller holds the device's lock.
//!
//! This file holds the types and the state; each job is one `impl DevicePool` block of its own:
//! - `hit.rs`: the hit path, a request served from its exact-size bin, and its budget;
//! - `grow.rs`: serving a request, and the ladder when no cached block fits (named steps);
//! - `fit.rs`: the bins and the best-fit index;
//! - `arena.rs`: splitting a block to hand it out, merging freed neighbours, the slots;
//! - `pending.rs`: frees, and the fences and barriers that make freed blocks reusable;
//! - `stream_hold.rs`: blocks held for the stream that freed them (`relaxed` mode);
//! - `release.rs`: the threshold, empty-cache, outgrown segments, reset; threshold and limit;
//! - `expandable.rs`: expandable segments, mapped and unmapped in granules;
//! - `slack.rs`: mapped memory kept within a slack of the peak allocated, by moving granules;
//! - `figures.rs`: where the memory lies (mapped, releasable, stranded), for the reports;
//! - `peers.rs`: peers' access to expandable segments, and their mapped runs;
//! - `lend.rs`: blocks lent to thread caches;
//! - `check.rs`: the structural check.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::backend::{Addr, Backend, CudaError};
use super::fifo::Fifo;
use super::free_lists::FreeLists;
use super::held_sets::{HeldKey, HeldSets};
use super::live_map::LiveMap;
use super::size::{
    class_of, may_serve, round_request, segment_size, served_by, should_split, usable_limit, Class,
    ALIGN, GROW_FROM, LARGE_SPLIT_REMAINDER, OUTGROWN_FROM, SMALL_LIMIT, SMALL_SEGMENT,
    THREAD_CACHED_LIMIT,
};
use super::stats::{counted, DeviceStats};
use super::trace::{Kind, TraceBuf};
use super::{FreeKind, ReuseClock, StreamKey, NO_STREAM};

mod arena;
mod check;
mod expandable;
mod figures;
mod fit;
mod granules;
mod grow;
mod hit;
mod lend;
mod mapping_oom;
mod peers;
mod pending;
mod placement;
mod release;
mod slack;
mod stream_hold;

pub use expandable::Expandable;
pub use figures::CacheFigures;

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
    /// Held by a thread cache (`tcache/`), handed out from there or waiting there for reuse;
    /// counted as allocated at its full size until it comes back.
    Lent,
}

/// What must happen before a freed block may be handed out again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReuseWait {
    /// Nothing: reusable at once (relaxed mode).
    Nothing,
    /// One legacy-stream action (covers blocking streams).
    Barrier,
    /// A device-wide fence (covers every stream).
    Fence,
}

impl ReuseWait {
    /// What a `Free` record's code (`need as u64`, `DevicePool::after_free`'s record) says the
    /// block's reuse waited for.
    pub fn from_code(code: u64) -> ReuseWait {
        match code {
            0 => ReuseWait::Nothing,
            1 => ReuseWait::Barrier,
            _ => ReuseWait::Fence,
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
    /// Its segment's class, kept here so that the hit path reads one line, not two.
    class: Class,
    /// The device's free sequence number at the time of the free (pending blocks only).
    stamp: u64,
    /// A pending block waits for a fence (else for a barrier).
    wants_fence: bool,
    /// A pending block held for the stream it was freed on (`DevicePool::held_by` names it),
    /// which may reuse it at once (`DevicePool::stream_reuse`). A flag, not the key, and the hit
    /// path reads nothing more.
    held: bool,
    /// Who allocated the live block: an address in the calling object (`Origin`).
    origin: Origin,
}

#[derive(Clone, Debug)]
struct Segment {
    addr: Addr,
    size: u64,
    class: Class,
    /// Live blocks inside; a segment with none can go back to the driver.
    live: u32,
    first: u32,
    /// A reserved range whose granules `DevicePool::ranges` tracks (`expandable.rs`). Its
    /// `live` count starts at one, a pin that never goes: it is never idle, since its free
    /// granules go back one by one. (A flag, not the bitmap, so that the struct keeps the size
    /// the hit path indexes by.)
    expandable: bool,
}

/// Settings shared by every device.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub max_split_size: u64,
    pub fence_bytes: u64,
    /// `GPUPOOL_EXPANDABLE_SLACK`, in thousandths of the peak allocated: how much more than
    /// its peak allocated the pool may hold before it moves free granules to a block that needs
    /// mapping instead of mapping more (`slack.rs`). `None`: it maps more.
    pub mapped_slack_permille: Option<u32>,
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
    /// A graph capture refused that fence: blocks awaiting in-flight work could neither serve
    /// nor go back.
    pub capture: bool,
    /// The request mapped granules of an expandable segment (else it asked for a segment).
    pub mapping: bool,
    /// After the mapping failed, the driver refused a segment of the request's own size too.
    pub segment_asked: bool,
    /// The pool's limit (`GPUPOOL_LIMIT`) refused a segment the retry asked for: the driver
    /// may have had the memory.
    pub limited: bool,
    pub memory: Option<MemorySample>,
}

/// Who made an allocation: the return address of the call into the library (an address inside
/// the calling object: `libtorch_cuda.so`, `libcublasLt.so`, the program), resolved to an
/// object only when a report is written. 0: not known.
pub type Origin = u64;

/// A live block as the pool reports it (for the leak list, the holders and IPC checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub addr: Addr,
    pub size: u64,
    pub requested: u64,
    pub segment_addr: Addr,
    pub origin: Origin,
}

pub struct DevicePool {
    device: u32,
    /// Who makes the allocation being served (set by `Pool` under the lock, before it asks):
    /// what `hand_out` records in the block, one store on the hit path.
    pub(crate) origin: Origin,
    /// Live blocks by address.
    live: LiveMap,
    /// One bin per small size: an array, so that a bin's index needs no bounds check.
    bins: Box<[Vec<u32>; BINS]>,
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
    /// Free small blocks larger than a small segment, by (size, address): only a small range
    /// has them (its frontier, and holes that merged past a segment's size).
    free_small_wide: BTreeMap<(u64, Addr), u32>,
    pending_fence: Fifo<(u32, u64)>,
    pending_barrier: Fifo<(u32, u64)>,
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
    held: HeldSets,
    /// The stream each held block is held for, by block handle (meaningful while the block's
    /// `held` flag is set), and how many blocks are held.
    held_by: Vec<StreamKey>,
    held_blocks: usize,
    /// Queue length (both queues) at which `compact_queues` next drops stale entries.
    compact_at: usize,
    /// The trace's number of each stream (tracing only).
    /// Not SipHash: its per-thread keys come from `getrandom`, a cancellation point on the
    /// thread that makes the device's pool (`pool::cancel`).
    stream_ids: HashMap<StreamKey, u16, BuildHasherDefault<super::IntHasher>>,
    /// Highest fence and barrier sequences this pool has applied, to tell the program's
    /// synchronizations from its own.
    fenced_seen: u64,
    barriered_seen: u64,
    /// The allocation trace, when `GPUPOOL_TRACE` is on. Boxed: the hit's test of a pointer
    /// against zero is one instruction less than of the buffer's own niche.
    trace: Option<Box<TraceBuf>>,
    /// The trace's file took no more records and `trace` went: thread caches, which a trace
    /// keeps off, are due a new look (`Pool::sample_allocation`).
    pub trace_dropped: bool,
    /// Cached bytes to keep; above it whole free segments go back to the driver.
    pub threshold: u64,
    /// Whether `threshold` bounds the reserved bytes instead, as CUDA's
    /// `cudaMemPoolAttrReleaseThreshold` does: a threshold the program set on a default memory
    /// pool (`release.rs`, `cache_allowance`).
    pub threshold_bounds_reserved: bool,
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
    /// The granule expandable segments map memory in; 0: expandable segments are off.
    granule: u64,
    /// Address space one expandable segment reserves.
    range_bytes: u64,
    /// The mapped granules of each expandable segment, by segment handle (one or two).
    ranges: Vec<(u32, granules::Granules)>,
    /// A block of an expandable segment became free since a release last looked for free
    /// granules (`make_free` sets it).
    unmap_due: bool,
    /// Ranges a reset could not give back whole (an unmap refused): their base, size and the
    /// granules left mapped, until `forget_all` takes them back.
    kept_after_reset: Vec<(Addr, u64, Class, granules::Granules)>,
    /// The size of the last requests carved at a range's frontier, and how many in a row
    /// (`placement.rs`, `starts_on_granule`).
    frontier_run: (u64, u32),
    /// Whether expandable segments are on, and if not, why (for the reports).
    expandable_use: Expandable,
    /// The driver's refusal that turned expandable segments off on this device (virtual memory
    /// missing or broken): classic segments serve since.
    pub expandable_refused: Option<CudaError>,
    /// A class whose range the driver refused for another reason than memory while the other
    /// class had one (by `Class as usize`): that class keeps classic segments, unasked again.
    range_refused: [bool; 2],
    /// A block's granules were once all mapped with access: a later refusal is taken as the
    /// driver's lack of memory, not as virtual memory missing.
    mapping_worked: bool,
    /// The devices given access to this device's mapped memory (`peers.rs`).
    peers: Arc<super::peers::PeerSet>,
    /// Allocations served under the device lock when the next one samples which thread
    /// allocates (every one up to 1 024, then every 64th).
    pub next_sample: u64,
    /// Allocations under the device lock until then: one decrement on the hit path.
    pub until_sample: u64,
    /// How threads competed for the device's lock while thread caches were off.
    pub contention: super::contention::Contention,
    /// Bumped by `forget_all`: thread caches drop what they hold from an earlier generation.
    pub generation: u64,
    /// Whoever holds blocks this pool lent (the device's thread caches).
    borrowers: Option<Arc<dyn Borrowers>>,
}

/// What a device pool asks of the holders of the blocks it lent (`tcache/`). Called under
/// the device's lock.
pub trait Borrowers: Send + Sync {
    /// Give every free block back (out of memory).
    fn reclaim(&self, p: &mut DevicePool, clock: &ReuseClock);
    /// Give the reusable blocks back (the pool would grow otherwise). Whether any came back.
    fn reclaim_ready(&self, p: &mut DevicePool, clock: &ReuseClock) -> bool;
    /// Give back some of the reusable blocks of exactly `size` bytes (what one holder keeps
    /// of a size another lacks). Whether any came back.
    fn reclaim_size(&self, p: &mut DevicePool, clock: &ReuseClock, size: u64) -> bool;
    /// Bytes held that wait for a barrier, and for a fence.
    fn waiting(&self, p: &DevicePool) -> (u64, u64);
}

impl DevicePool {
    pub fn new(device: u32, threshold: u64) -> Self {
        DevicePool {
            device,
            origin: 0,
            live: LiveMap::default(),
            // Built on the heap: 48 KiB would not fit every program thread's stack.
            bins: vec![Vec::new(); BINS]
                .into_boxed_slice()
                .try_into()
                .expect("BINS bins"),
            bin_mask: [0; BINS / 64],
            binned_bytes: 0,
            blocks: Vec::new(),
            vacant_blocks: Vec::new(),
            segments: Vec::new(),
            vacant_segments: Vec::new(),
            by_addr: BTreeMap::new(),
            free_small: FreeLists::default(),
            free_large: BTreeMap::new(),
            free_small_wide: BTreeMap::new(),
            pending_fence: Fifo::default(),
            pending_barrier: Fifo::default(),
            pending_fence_bytes: 0,
            pending_barrier_bytes: 0,
            stream_reuse: false,
            stream_requests: false,
            held: HeldSets::default(),
            held_by: Vec::new(),
            held_blocks: 0,
            compact_at: COMPACT_FROM,
            stream_ids: HashMap::default(),
            fenced_seen: 0,
            barriered_seen: 0,
            trace: None,
            trace_dropped: false,
            threshold,
            threshold_bounds_reserved: false,
            limit: u64::MAX,
            limit_refused: false,
            memory: None,
            memory_first: None,
            last_oom: None,
            stats: DeviceStats::default(),
            largest_segment: 0,
            idle_bytes: 0,
            lent: 0,
            granule: 0,
            range_bytes: 0,
            ranges: Vec::new(),
            unmap_due: false,
            kept_after_reset: Vec::new(),
            frontier_run: (0, 0),
            expandable_use: Expandable::Off,
            expandable_refused: None,
            range_refused: [false; 2],
            mapping_worked: false,
            peers: Arc::default(),
            next_sample: 1,
            until_sample: 1,
            contention: Default::default(),
            generation: 0,
            borrowers: None,
        }
    }

    /// Who will hold the blocks this pool lends.
    pub fn set_borrowers(&mut self, borrowers: Arc<dyn Borrowers>) {
        self.borrowers = Some(borrowers);
    }

    /// Record every decision from now on into `trace`.
    pub fn set_trace(&mut self, trace: TraceBuf, policy: &Policy, reuse: u16) {
        self.trace = Some(Box::new(trace));
        self.record(
            Kind::Settings,
            policy.max_split_size,
            policy.fence_bytes,
            self.threshold,
            reuse,
        );
        if let Some(permille) = policy.mapped_slack_permille {
            self.record(Kind::MappedSlack, u64::from(permille), 0, 0, 0);
        }
    }

    /// The program made work no barrier orders, a non-blocking stream or a context of its own
    /// (for the trace: a replay in `barrier` mode fences from here on, as the live pool does).
    pub fn note_work_beyond_barriers(&mut self) {
        self.record(Kind::BeyondBarriers, 0, 0, 0, 0);
    }

    /// One trace record, when tracing. The test inline, the record out of line: the hit path
    /// records each allocation and free, and pays the test alone. Inlined, the record's call
    /// and the drop of a trace that stopped made the hit read the device's fields again after
    /// it.
    #[inline(always)]
    fn record(&mut self, kind: Kind, a: u64, b: u64, c: u64, aux: u16) {
        if self.trace.is_some() {
            self.record_traced(kind, a, b, c, aux);
        }
    }

    #[inline(never)]
    fn record_traced(&mut self, kind: Kind, a: u64, b: u64, c: u64, aux: u16) {
        if let Some(t) = self.trace.as_mut() {
            if !t.record(kind, a, b, c, aux) {
                self.drop_trace();
            }
        }
    }

    /// Hand buffered trace records to the sink.
    pub fn flush_trace(&mut self) {
        if let Some(t) = self.trace.as_mut() {
            if !t.flush() {
                self.drop_trace();
            }
        }
    }

    /// The trace's file takes no more records: the device records nothing more, and thread
    /// caches are due a new look (`trace_dropped`).
    #[cold]
    #[inline(never)]
    fn drop_trace(&mut self) {
        self.trace = None;
        self.trace_dropped = true;
    }

    /// Cached bytes: reserved from the driver but not handed out (free or pending).
    pub fn cached(&self) -> u64 {
        self.stats.reserved.current - self.stats.allocated.current
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_fence_bytes + self.pending_barrier_bytes
    }

    /// Whether `addr` is a live block of this device.
    pub fn is_live(&self, addr: Addr) -> bool {
        self.live.contains_key(addr)
    }

    /// Live blocks on this device.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    #[inline(always)]
    fn seg(&self, i: u32) -> &Segment {
        self.segments[i as usize]
            .as_ref()
            .expect("block in a released segment")
    }

    #[inline(always)]
    fn seg_mut(&mut self, i: u32) -> &mut Segment {
        self.segments[i as usize]
            .as_mut()
            .expect("block in a released segment")
    }

    /// The segment holding `addr`, as (base, size); in an expandable segment, the run of
    /// mapped granules around it (what the driver calls its allocation).
    pub fn segment_containing(&self, addr: Addr) -> Option<(Addr, u64)> {
        let (_, &si) = self.by_addr.range(..=addr).next_back()?;
        let s = self.seg(si);
        if addr >= s.addr + s.size {
            return None;
        }
        if s.expandable {
            self.mapped_run(si, addr)
        } else {
            Some((s.addr, s.size))
        }
    }

    /// Whether `addr` lies past the start of a block the program may hold: a live one, or one
    /// lent to a thread cache, which may have handed it out. (The start of a live block is
    /// `live_block_at`'s; any other address of the pool's is freed memory.)
    pub fn inside_held_block(&self, addr: Addr) -> bool {
        let Some((_, &si)) = self.by_addr.range(..=addr).next_back() else {
            return false;
        };
        let mut i = self.seg(si).first;
        while let Some(b) = self.blocks.get(i as usize).filter(|_| i != NONE) {
            if addr < b.addr + b.size {
                return b.addr < addr && matches!(b.state, State::Live | State::Lent);
            }
            i = b.next;
        }
        false
    }

    /// The live block at `addr`.
    pub fn live_block_at(&self, addr: Addr) -> Option<LiveBlock> {
        self.live_block(self.live.get(addr)?)
    }

    /// Live block `idx` as the pool sees it.
    fn live_block(&self, idx: u32) -> Option<LiveBlock> {
        let b = self.blocks.get(idx as usize)?;
        (b.state == State::Live).then(|| LiveBlock {
            addr: b.addr,
            size: b.size,
            requested: b.requested,
            segment_addr: self.seg(b.seg).addr,
            origin: b.origin,
        })
    }

    /// Blocks allocated from an address in `from` are recorded as allocated by `to` instead
    /// (their object was unloaded: `Pool::rename_origins`).
    pub fn rename_origins(&mut self, from: &std::ops::Range<Origin>, to: Origin) {
        for b in &mut self.blocks {
            if from.contains(&b.origin) {
                b.origin = to;
            }
        }
    }

    /// Every live block (for the leak list at exit).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        (0..self.blocks.len() as u32)
            .filter_map(|i| self.live_block(i))
            .collect()
    }
}
