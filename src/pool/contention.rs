//! Whether threads compete for a device's lock: in `strict` and `barrier` mode, thread caches
//! start only once they do.

/// `Settings::cache_contention` by default: in `strict` and `barrier` mode, thread caches start
/// once the device's lock went from one allocating thread to another (or an allocation found it
/// taken) this many times within 65 536 allocations under it, or allocating threads waited for
/// it long enough (`CONTENTION_WAIT_NS`). Threads that take turns by phases (PyTorch's forward
/// and backward) keep the one lock and the device's own fences; threads that allocate at the
/// same time reach one or the other within milliseconds. Changes of hands count, not only
/// collisions: two threads that alternate on the lock pay for moving it and the pool's lines
/// between cores even when neither finds it taken.
pub const CONTENTION: u64 = 1024;
/// Waiting for the device's lock that also starts thread caches in `strict` and `barrier` mode:
/// at least this long in all, over at least `CONTENTION_WAITS` waits, and a quarter of the time
/// since the count started over, both without the time the pool spent in the backend under the
/// lock (a fence there is not contention, and one long wait, a holder preempted once, is not
/// either). A lock whose holder takes it again before a woken waiter runs (as `parking_lot`'s
/// does, for speed) changes hands seldom, yet every release then wakes the waiter in the
/// kernel: measured on the two-thread churn, 15-800 handoffs per 65 536 allocations at a
/// quarter of one thread's rate.
pub const CONTENTION_WAIT_NS: u64 = 1_000_000;
/// See `CONTENTION_WAIT_NS`.
pub const CONTENTION_WAITS: u64 = 4;

/// How allocating threads competed for a device's lock since the count last started over
/// (every 65 536 allocations under it): kept under the lock, in the pool's own lines.
#[derive(Default)]
pub struct Contention {
    holder: usize,
    handoffs: u64,
    /// Allocations that found the lock taken, and of those, waits that counted (longer than the
    /// holder's time in the backend meanwhile).
    collisions: u64,
    waits: u64,
    waited_ns: u64,
    since: Option<std::time::Instant>,
    /// `DeviceSlot::backend_ns` when the count started.
    backend_at_since: u64,
}

impl Contention {
    /// The calling thread took the lock to allocate, after waiting `waited_ns` (without the
    /// holder's time in the backend) if it found it taken; `backend_ns` is the device's time in
    /// the backend so far.
    #[inline(never)]
    pub fn took(&mut self, waited_ns: Option<u64>, backend_ns: u64) {
        let me = thread_token();
        if self.holder != me || waited_ns.is_some() {
            self.holder = me;
            self.handoffs += 1;
        }
        self.collisions += u64::from(waited_ns.is_some());
        if let Some(ns) = waited_ns.filter(|&ns| ns > 0) {
            self.waits += 1;
            self.waited_ns += ns;
        }
        if self.since.is_none() {
            self.since = Some(std::time::Instant::now());
            self.backend_at_since = backend_ns;
        }
    }

    /// Whether threads compete enough for caches to pay: `handoffs` changes of hands (or
    /// collisions), or waiting as `CONTENTION_WAIT_NS` says.
    pub fn reached(&self, handoffs: u64, backend_ns: u64) -> bool {
        if self.handoffs >= handoffs {
            return true;
        }
        self.waits >= CONTENTION_WAITS
            && self.waited_ns >= CONTENTION_WAIT_NS
            && self.since.is_some_and(|t| {
                let elapsed = t.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                let in_backend = backend_ns.saturating_sub(self.backend_at_since);
                self.waited_ns >= elapsed.saturating_sub(in_backend) / 4
            })
    }

    /// Allocations that found the lock taken, and the waiting counted, since the count started
    /// over.
    pub fn collisions(&self) -> (u64, u64) {
        (self.collisions, self.waited_ns)
    }

    /// Start the count over.
    pub fn restart(&mut self) {
        *self = Contention {
            holder: self.holder,
            ..Contention::default()
        };
    }
}

/// A number that tells the calling thread from every other live thread. `pthread_self` reads
/// the thread's control block: a thread-local variable would cost a `__tls_get_addr` call in a
/// preloaded library, on every allocation of a single-threaded program.
pub fn thread_token() -> usize {
    // SAFETY: pthread_self has no preconditions and cannot fail.
    unsafe { libc::pthread_self() as usize }
}
