//! The in-flight model: time, streams and their tails, and the queue of operations whose
//! completion has an effect (a kernel's fill, a stream-ordered free).

use std::collections::HashMap;
use std::time::Duration;

/// Nanoseconds of `CLOCK_MONOTONIC`.
pub type Nanos = u64;

/// The current time.
pub fn now() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Microseconds as nanoseconds.
pub fn micros(us: u64) -> Nanos {
    us.saturating_mul(1_000)
}

/// Sleeps until `CLOCK_MONOTONIC` reaches `deadline`. Never call it holding the state lock.
pub fn sleep_until(deadline: Nanos) {
    loop {
        let t = now();
        if t >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_nanos(deadline - t));
    }
}

/// How a stream orders itself against the legacy default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The legacy default stream: waits for every blocking stream of its device.
    Legacy,
    /// Waits for the legacy stream (`cudaStreamDefault`, and `cudaStreamPerThread`).
    Blocking,
    /// Ignores the legacy stream (`cudaStreamNonBlocking`).
    NonBlocking,
}

/// `enum cudaStreamCaptureMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    /// `cudaStreamCaptureModeGlobal` (0): no unsafe call (`cudaMalloc`) on any thread.
    Global,
    /// `cudaStreamCaptureModeThreadLocal` (1): none on the capturing thread.
    ThreadLocal,
    /// `cudaStreamCaptureModeRelaxed` (2): no restriction.
    Relaxed,
}

/// A capture in progress (`cudaStreamBeginCapture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capture {
    pub mode: CaptureMode,
    /// The capturing thread (`current::thread_key`).
    pub thread: u64,
    /// A call CUDA forbids during the capture was made: `cudaStreamEndCapture` then gives 901.
    pub invalidated: bool,
    /// The program's graph it captures into (`cudaStreamBeginCaptureToGraph`), else none: the
    /// end makes a new one.
    pub into: Option<usize>,
}

#[derive(Clone, Copy, Debug)]
pub struct Stream {
    pub device: usize,
    pub kind: Kind,
    /// `cudaStreamGetId`: unique for the life of the process, never reused.
    pub id: u64,
    /// When the last operation enqueued on the stream completes.
    pub tail: Nanos,
    /// The capture in progress on it, if any (never on the legacy stream).
    pub capture: Option<Capture>,
    /// The created context (`cuCtxCreate_v2`) it belongs to: the one current when it was made,
    /// or, for a default stream, whose default stream it is. `None`: the device's primary
    /// context.
    pub context: Option<usize>,
}

impl Stream {
    fn new(device: usize, kind: Kind, context: Option<usize>) -> Stream {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Stream {
            device,
            kind,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            tail: 0,
            capture: None,
            context,
        }
    }
}

/// A stream, resolved from a `cudaStream_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamId {
    /// `0` or `cudaStreamLegacy` of a device's context: its primary one (`None`), or a created
    /// one. As in CUDA, each context has its own.
    Legacy(usize, Option<usize>),
    /// `cudaStreamPerThread` of a device's context for one thread (`current::thread_key`): as
    /// in CUDA, each thread has its own, a blocking stream of that context.
    PerThread(usize, Option<usize>, u64),
    /// A created stream: the address of its handle.
    User(usize),
}

/// A context's legacy default stream.
#[derive(Clone, Copy, Debug)]
struct Legacy {
    stream: Stream,
    /// When the work of the context's destroyed blocking streams ends: the legacy stream still
    /// waits for it.
    retired_blocking: Nanos,
    /// The context is a green context's (`cuGreenCtxCreate`): the primary context's
    /// synchronization waits for its streams too, as CUDA documents for `cuCtxSynchronize`.
    green: bool,
}

impl Legacy {
    fn new(device: usize, context: Option<usize>, green: bool) -> Legacy {
        Legacy {
            stream: Stream::new(device, Kind::Legacy, context),
            retired_blocking: 0,
            green,
        }
    }
}

/// Every stream of every device.
///
/// A blocking stream orders itself against the legacy stream of its own context, and that
/// legacy stream against the context's blocking streams alone: a created context's work is
/// not ordered against the primary context's legacy stream, nor the reverse.
pub struct Streams {
    /// Each device's primary context's legacy stream.
    legacy: Vec<Legacy>,
    /// Each live created context's legacy stream, by context.
    created: HashMap<usize, Legacy>,
    /// The per-thread default streams used so far, by (device, context, thread).
    per_thread: HashMap<(usize, Option<usize>, u64), Stream>,
    user: HashMap<usize, Stream>,
    /// Per device, when the work of its destroyed streams (and destroyed contexts' default
    /// streams) ends: a destroyed stream's work still runs, and a device synchronization still
    /// waits for it.
    retired: Vec<Nanos>,
}

impl Streams {
    pub fn new(devices: usize) -> Streams {
        Streams {
            legacy: (0..devices).map(|d| Legacy::new(d, None, false)).collect(),
            created: HashMap::new(),
            per_thread: HashMap::new(),
            user: HashMap::new(),
            retired: vec![0; devices],
        }
    }

    /// Registers a created stream under its handle's address, made in `context` (`None`: the
    /// device's primary context).
    pub fn add(&mut self, handle: usize, device: usize, kind: Kind, context: Option<usize>) {
        self.user.insert(handle, Stream::new(device, kind, context));
    }

    /// Unregisters a created stream; false if there is none at that address.
    pub fn remove(&mut self, handle: usize) -> bool {
        let Some(s) = self.user.remove(&handle) else {
            return false;
        };
        let all = &mut self.retired[s.device];
        *all = (*all).max(s.tail);
        if s.kind == Kind::Blocking {
            if let Some(l) = self.legacy_mut(s.device, s.context) {
                l.retired_blocking = l.retired_blocking.max(s.tail);
            }
        }
        true
    }

    pub fn contains(&self, handle: usize) -> bool {
        self.user.contains_key(&handle)
    }

    /// A context created on device `d` (`cuCtxCreate_v2`; `green`: a green context's,
    /// `cuGreenCtxCreate`): its legacy stream. A green context's streams order themselves as a
    /// created context's do; only the primary context's synchronization differs.
    pub fn add_context(&mut self, context: usize, d: usize, green: bool) {
        self.created
            .insert(context, Legacy::new(d, Some(context), green));
    }

    /// A created context destroyed: its default streams go, their work still runs (a device
    /// synchronization waits for it). Its created streams stay, as before. A green context's
    /// work, its created streams' too, still counts for the primary context's synchronization.
    pub fn remove_context(&mut self, context: usize) {
        let Some(l) = self.created.remove(&context) else {
            return;
        };
        let d = l.stream.device;
        let mut end = l.stream.tail.max(l.retired_blocking);
        if l.green {
            let own = self.user.values().filter(|s| s.context == Some(context));
            end = own.map(|s| s.tail).fold(end, Nanos::max);
        }
        self.per_thread.retain(|&(_, c, _), s| {
            let keep = c != Some(context);
            if !keep {
                end = end.max(s.tail);
            }
            keep
        });
        self.retired[d] = self.retired[d].max(end);
    }

    /// The stream `id` (a per-thread default stream not used yet is made by its first use).
    pub fn get(&mut self, id: StreamId) -> &Stream {
        self.get_mut(id)
    }

    /// Begins (`Some`) or ends (`None`) a capture on stream `id` (not the legacy stream).
    pub fn set_capture(&mut self, id: StreamId, capture: Option<Capture>) {
        self.get_mut(id).capture = capture;
    }

    /// Whether a capture forbids an unsafe call (`cudaMalloc`) on thread `thread`, whose own
    /// mode (`cudaThreadExchangeStreamCaptureMode`) is `mode`, as CUDA says: in global mode,
    /// a capture in global mode on any thread or a capture not in relaxed mode on this one; in
    /// thread-local mode, only the latter; in relaxed mode, none. The captures that forbid it
    /// are invalidated, as CUDA invalidates them.
    pub fn refuse_unsafe_call(&mut self, thread: u64, mode: CaptureMode) -> bool {
        self.invalidate(|_, c| {
            let own = c.thread == thread && c.mode != CaptureMode::Relaxed;
            match mode {
                CaptureMode::Global => own || c.mode == CaptureMode::Global,
                CaptureMode::ThreadLocal => own,
                CaptureMode::Relaxed => false,
            }
        })
    }

    /// Whether a synchronization of device `d` is refused: CUDA forbids synchronizing a device
    /// while one of its streams is being captured, and invalidates those captures.
    pub fn refuse_device_sync(&mut self, d: usize) -> bool {
        self.invalidate(|s, _| s.device == d)
    }

    /// Whether a use of stream `id` is refused as an implicit dependency on a capture: the
    /// legacy stream of a context while one of its blocking streams is being captured (CUDA
    /// gives `cudaErrorStreamCaptureImplicit` and invalidates those captures).
    pub fn refuse_legacy_use(&mut self, id: StreamId) -> bool {
        let StreamId::Legacy(d, context) = id else {
            return false;
        };
        self.invalidate(|s, _| s.device == d && s.context == context && s.kind == Kind::Blocking)
    }

    /// Whether stream `id` is the legacy stream of a context with a blocking stream being
    /// captured (the query does not invalidate).
    pub fn legacy_implicitly_captured(&self, id: StreamId) -> bool {
        let StreamId::Legacy(d, context) = id else {
            return false;
        };
        self.per_thread.values().chain(self.user.values()).any(|s| {
            s.device == d && s.context == context && s.kind == Kind::Blocking && s.capture.is_some()
        })
    }

    /// Marks invalidated every capture whose stream and capture `hit` picks; whether any.
    fn invalidate(&mut self, hit: impl Fn(&Stream, &Capture) -> bool) -> bool {
        let mut any = false;
        for s in self.per_thread.values_mut().chain(self.user.values_mut()) {
            let stream = *s;
            if let Some(c) = s.capture.as_mut() {
                if hit(&stream, c) {
                    c.invalidated = true;
                    any = true;
                }
            }
        }
        any
    }

    /// The legacy stream of `context` on device `d`, if that context lives.
    fn legacy_of(&self, d: usize, context: Option<usize>) -> Option<&Legacy> {
        match context {
            None => self.legacy.get(d),
            Some(c) => self.created.get(&c),
        }
    }

    fn legacy_mut(&mut self, d: usize, context: Option<usize>) -> Option<&mut Legacy> {
        match context {
            None => self.legacy.get_mut(d),
            Some(c) => self.created.get_mut(&c),
        }
    }

    fn get_mut(&mut self, id: StreamId) -> &mut Stream {
        match id {
            StreamId::Legacy(d, context) => {
                &mut self
                    .legacy_mut(d, context)
                    .expect("context checked by the caller")
                    .stream
            }
            StreamId::PerThread(d, context, t) => self
                .per_thread
                .entry((d, context, t))
                .or_insert_with(|| Stream::new(d, Kind::Blocking, context)),
            StreamId::User(h) => self.user.get_mut(&h).expect("stream checked by the caller"),
        }
    }

    /// Every stream of device `d`, of all its contexts.
    fn of_device(&self, d: usize) -> impl Iterator<Item = &Stream> {
        std::iter::once(&self.legacy[d].stream)
            .chain(self.created.values().map(|l| &l.stream))
            .chain(self.per_thread.values())
            .chain(self.user.values())
            .filter(move |s| s.device == d)
    }

    /// The streams of one context of device `d` (`None`: the primary one).
    fn of_context(&self, d: usize, context: Option<usize>) -> impl Iterator<Item = &Stream> {
        self.of_device(d).filter(move |s| s.context == context)
    }

    /// Enqueues an operation of `duration` on stream `id`, after `dep` (an event's time, or 0):
    /// `start = max(now, tail, dep, what the stream's kind waits for)`, `tail = start + duration`.
    /// Returns the operation's end.
    pub fn enqueue(&mut self, id: StreamId, now: Nanos, duration: Nanos, dep: Nanos) -> Nanos {
        let stream = *self.get_mut(id);
        let (d, context) = (stream.device, stream.context);
        let legacy = self.legacy_of(d, context);
        let waits_for = match stream.kind {
            Kind::Legacy => self
                .of_context(d, context)
                .filter(|s| s.kind == Kind::Blocking)
                .map(|s| s.tail)
                .max()
                .unwrap_or(0)
                .max(legacy.map_or(0, |l| l.retired_blocking)),
            // A stream of a destroyed context waits for no legacy stream.
            Kind::Blocking => legacy.map_or(0, |l| l.stream.tail),
            Kind::NonBlocking => 0,
        };
        let start = now.max(stream.tail).max(dep).max(waits_for);
        let end = start.saturating_add(duration);
        self.get_mut(id).tail = end;
        end
    }

    /// When all work of device `d` is done, in every context.
    pub fn device_tail(&self, d: usize) -> Nanos {
        let live = self.of_device(d).map(|s| s.tail).max().unwrap_or(0);
        live.max(self.retired[d])
    }

    /// When the work a context's synchronization waits for is done (`cuCtxSynchronize`): its
    /// own streams, default and created. Only the primary context's waits for destroyed
    /// streams too, and for the streams of the device's green contexts.
    pub fn context_tail(&self, d: usize, context: Option<usize>) -> Nanos {
        let tail = |c: Option<usize>| self.of_context(d, c).map(|s| s.tail).max().unwrap_or(0);
        match context {
            None => {
                let green = self.created.iter().filter(|(_, l)| l.green);
                let greens = green.map(|(&c, _)| tail(Some(c))).max().unwrap_or(0);
                tail(None).max(greens).max(self.retired[d])
            }
            Some(_) => tail(context),
        }
    }

    /// Forgets device `d`'s work, in every context, and its created streams
    /// (`cudaDeviceReset`); returns the handles of the streams removed. Created contexts stay,
    /// with their legacy streams.
    pub fn reset_device(&mut self, d: usize) -> Vec<usize> {
        let legacies = std::iter::once(&mut self.legacy[d]).chain(self.created.values_mut());
        for l in legacies.filter(|l| l.stream.device == d) {
            l.stream.tail = 0;
            l.retired_blocking = 0;
        }
        self.per_thread.retain(|&(device, _, _), _| device != d);
        self.retired[d] = 0;
        let gone: Vec<usize> = self
            .user
            .iter()
            .filter(|(_, s)| s.device == d)
            .map(|(&h, _)| h)
            .collect();
        for h in &gone {
            self.user.remove(h);
        }
        gone
    }
}

/// What happens when a queued operation completes.
#[derive(Clone, Copy, Debug)]
pub enum Completion {
    /// A simulated kernel busy on `[base, base + len)`, writing `fill` there when it ends.
    Kernel {
        device: usize,
        base: usize,
        len: usize,
        fill: Option<u8>,
    },
    /// `cudaFreeAsync` of the allocation at `base` reached its point in the stream.
    AsyncFree { device: usize, base: usize },
}

impl Completion {
    pub fn device(&self) -> usize {
        match *self {
            Completion::Kernel { device, .. } | Completion::AsyncFree { device, .. } => device,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Pending {
    pub at: Nanos,
    seq: u64,
    pub what: Completion,
}

/// Operations not yet retired.
#[derive(Default)]
pub struct Queue {
    items: Vec<Pending>,
    next_seq: u64,
}

impl Queue {
    pub fn push(&mut self, at: Nanos, what: Completion) {
        self.items.push(Pending {
            at,
            seq: self.next_seq,
            what,
        });
        self.next_seq += 1;
    }

    /// Removes and returns the operations complete at `now`, in completion order (ties in
    /// the order they were enqueued).
    pub fn take_due(&mut self, now: Nanos) -> Vec<Pending> {
        if self.items.iter().all(|p| p.at > now) {
            return Vec::new();
        }
        let (mut due, rest): (Vec<Pending>, Vec<Pending>) =
            self.items.drain(..).partition(|p| p.at <= now);
        self.items = rest;
        due.sort_by_key(|p| (p.at, p.seq));
        due
    }

    /// The kernels still queued (not complete at the last retirement) overlapping `[lo, hi)`.
    pub fn kernels_overlapping(&self, lo: usize, hi: usize) -> usize {
        self.items
            .iter()
            .filter(|p| match p.what {
                Completion::Kernel { base, len, .. } => base < hi && lo < base + len,
                Completion::AsyncFree { .. } => false,
            })
            .count()
    }

    /// Keeps the queued kernels busy but takes away their writes (a forked child's copy of
    /// its parent's work).
    pub fn drop_writes(&mut self) {
        for p in &mut self.items {
            if let Completion::Kernel { fill, .. } = &mut p.what {
                *fill = None;
            }
        }
    }

    /// Drops the queued operations of device `d` (`cudaDeviceReset`).
    pub fn forget_device(&mut self, d: usize) {
        self.items.retain(|p| p.what.device() != d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_and_blocking_streams_order_each_other() {
        let mut s = Streams::new(1);
        s.add(0x100, 0, Kind::Blocking, None);
        s.add(0x200, 0, Kind::NonBlocking, None);
        assert_eq!(s.enqueue(StreamId::User(0x100), 10, 100, 0), 110);
        assert_eq!(s.enqueue(StreamId::User(0x200), 10, 500, 0), 510);
        // The legacy stream waits for the blocking stream, not for the non-blocking one.
        assert_eq!(s.enqueue(StreamId::Legacy(0, None), 20, 0, 0), 110);
        assert_eq!(s.enqueue(StreamId::Legacy(0, None), 20, 50, 0), 160);
        // A blocking stream waits for the legacy stream.
        assert_eq!(s.enqueue(StreamId::PerThread(0, None, 1), 30, 0, 0), 160);
        // A dependency (an event) delays the start.
        assert_eq!(s.enqueue(StreamId::User(0x200), 30, 0, 600), 600);
        assert_eq!(s.device_tail(0), 600);
        assert_eq!(s.reset_device(0).len(), 2);
        assert_eq!(s.device_tail(0), 0);
    }

    #[test]
    fn a_context_waits_for_its_own_streams_alone() {
        const MINE: usize = 0x999;
        let mut s = Streams::new(1);
        s.add_context(MINE, 0, false);
        s.add(0x100, 0, Kind::NonBlocking, None);
        s.add(0x200, 0, Kind::NonBlocking, Some(MINE));
        assert_eq!(s.enqueue(StreamId::User(0x100), 0, 500, 0), 500);
        assert_eq!(s.enqueue(StreamId::User(0x200), 0, 300, 0), 300);
        assert_eq!(s.context_tail(0, Some(MINE)), 300);
        assert_eq!(s.context_tail(0, None), 500);
        // The primary context's legacy stream is not the created context's.
        assert_eq!(s.enqueue(StreamId::Legacy(0, None), 0, 800, 0), 800);
        assert_eq!(s.context_tail(0, Some(MINE)), 300);
        assert_eq!(s.enqueue(StreamId::Legacy(0, Some(MINE)), 0, 900, 0), 900);
        assert_eq!(s.context_tail(0, Some(MINE)), 900);
        assert_eq!(s.context_tail(0, None), 800);
        assert_eq!(s.device_tail(0), 900);
    }

    #[test]
    fn a_created_contexts_blocking_stream_orders_against_its_own_legacy_stream_alone() {
        const MINE: usize = 0x999;
        let mut s = Streams::new(1);
        s.add_context(MINE, 0, false);
        s.add(0x100, 0, Kind::Blocking, Some(MINE));
        s.add(0x200, 0, Kind::Blocking, None);
        // A kernel on the created context's blocking stream: the primary's legacy stream does
        // not wait for it, its own context's does.
        assert_eq!(s.enqueue(StreamId::User(0x100), 0, 1_000, 0), 1_000);
        assert_eq!(s.enqueue(StreamId::Legacy(0, None), 10, 0, 0), 10);
        assert_eq!(s.enqueue(StreamId::Legacy(0, Some(MINE)), 10, 0, 0), 1_000);
        // Nor does the primary's blocking stream wait for the created context's legacy stream,
        // which its own blocking streams, default ones too, do.
        assert_eq!(
            s.enqueue(StreamId::Legacy(0, Some(MINE)), 20, 500, 0),
            1_500
        );
        assert_eq!(s.enqueue(StreamId::User(0x200), 30, 0, 0), 30);
        assert_eq!(s.enqueue(StreamId::PerThread(0, None, 1), 30, 0, 0), 30);
        assert_eq!(
            s.enqueue(StreamId::PerThread(0, Some(MINE), 1), 30, 0, 0),
            1_500
        );
        assert_eq!(s.enqueue(StreamId::User(0x100), 40, 0, 0), 1_500);
        // And the primary's legacy stream orders nothing of the created context's.
        assert_eq!(s.enqueue(StreamId::Legacy(0, None), 50, 200, 0), 250);
        assert_eq!(s.enqueue(StreamId::User(0x100), 60, 0, 0), 1_500);
        assert_eq!(
            s.enqueue(StreamId::PerThread(0, Some(MINE), 1), 60, 0, 0),
            1_500
        );
        assert_eq!(s.enqueue(StreamId::Legacy(0, Some(MINE)), 70, 0, 0), 1_500);
    }

    #[test]
    fn a_destroyed_contexts_work_still_counts_for_the_device() {
        const MINE: usize = 0x999;
        let mut s = Streams::new(1);
        s.add_context(MINE, 0, false);
        s.add(0x100, 0, Kind::Blocking, Some(MINE));
        assert_eq!(s.enqueue(StreamId::Legacy(0, Some(MINE)), 0, 700, 0), 700);
        assert_eq!(
            s.enqueue(StreamId::PerThread(0, Some(MINE), 1), 0, 100, 0),
            800
        );
        // A destroyed blocking stream's work: its context's legacy stream still waits for it.
        assert_eq!(s.enqueue(StreamId::User(0x100), 0, 400, 0), 1_100);
        assert!(s.remove(0x100));
        assert_eq!(s.enqueue(StreamId::Legacy(0, Some(MINE)), 0, 0, 0), 1_100);
        s.remove_context(MINE);
        assert_eq!(s.device_tail(0), 1_100);
        assert_eq!(s.context_tail(0, None), 1_100);
        assert_eq!(s.enqueue(StreamId::Legacy(0, None), 0, 0, 0), 0);
        assert_eq!(s.reset_device(0).len(), 0);
        assert_eq!(s.device_tail(0), 0);
    }

    #[test]
    fn the_primary_contexts_synchronization_waits_for_green_contexts_alone() {
        const GREEN: usize = 0x777;
        const MINE: usize = 0x999;
        let mut s = Streams::new(1);
        s.add_context(GREEN, 0, true);
        s.add_context(MINE, 0, false);
        s.add(0x100, 0, Kind::NonBlocking, Some(GREEN));
        s.add(0x200, 0, Kind::NonBlocking, Some(MINE));
        assert_eq!(s.enqueue(StreamId::User(0x100), 0, 500, 0), 500);
        assert_eq!(s.enqueue(StreamId::User(0x200), 0, 900, 0), 900);
        // The primary's synchronization waits for the green context's work, not for a created
        // context's; the green context's waits for its own alone.
        assert_eq!(s.context_tail(0, None), 500);
        assert_eq!(s.context_tail(0, Some(GREEN)), 500);
        // Its legacy stream orders nothing of the primary's, as a created context's.
        assert_eq!(s.enqueue(StreamId::Legacy(0, None), 0, 0, 0), 0);
        assert_eq!(s.enqueue(StreamId::Legacy(0, Some(GREEN)), 0, 100, 0), 100);
        assert_eq!(s.context_tail(0, None), 500);
        // Destroyed, its work still counts for the primary context.
        s.remove_context(GREEN);
        assert_eq!(s.context_tail(0, None), 500);
    }

    #[test]
    fn queue_retires_in_completion_order() {
        let mut q = Queue::default();
        let k = |base| Completion::Kernel {
            device: 0,
            base,
            len: 16,
            fill: Some(1),
        };
        q.push(30, k(0x1000));
        q.push(10, k(0x2000));
        q.push(10, k(0x3000));
        assert_eq!(q.kernels_overlapping(0x2008, 0x2009), 1);
        let due: Vec<Nanos> = q.take_due(20).iter().map(|p| p.at).collect();
        assert_eq!(due, vec![10, 10]);
        assert_eq!(q.kernels_overlapping(0, usize::MAX), 1);
        assert!(q.take_due(29).is_empty());
        assert_eq!(q.take_due(30).len(), 1);
    }
}
