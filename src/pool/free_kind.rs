//! How the program gave a block back, the streams it may name, and what each reuse mode makes
//! a free wait for.

use super::ReuseWait;
use crate::config::ReuseMode;

/// How the program gave a block back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeKind {
    /// `cudaFree`.
    Sync,
    /// `cudaFreeAsync` on a stream; `blocking` is false for a non-blocking stream.
    Async { blocking: bool, stream: StreamKey },
    /// The program's own `cudaFreeAsync`, in `strict` or `barrier` mode. CUDA's contract for
    /// it is that every use of the block is ordered before the free on `stream` (work on other
    /// streams by events), so the stream's later requests may take it at once, as the
    /// runtime's `cudaMallocAsync` would. Other streams wait for a fence. The pool's own
    /// stream-ordered frees (`gpupool_free_async`, PyTorch's pluggable free, which is not told
    /// of `record_stream`) promise less and stay `Async`.
    Ordered { stream: StreamKey },
}

/// Names a stream for stream-ordered reuse (`Pool::alloc_on`): in the library, the runtime's
/// unique id of the stream (`dispatch::stream_key`); in a replay, the trace's number for it.
pub type StreamKey = u64;

/// No stream, or one the runtime could not name: never reused in stream order.
pub const NO_STREAM: StreamKey = StreamKey::MAX;
/// The legacy default stream's name (`dispatch::stream_key`), out of the range of the runtime's
/// stream ids (a counter from zero).
pub const LEGACY_STREAM: StreamKey = StreamKey::MAX - 1;

impl FreeKind {
    /// The code the trace records.
    pub fn code(self) -> u16 {
        match self {
            FreeKind::Sync => 0,
            FreeKind::Async { blocking: true, .. } => 1,
            FreeKind::Async {
                blocking: false, ..
            } => 2,
            FreeKind::Ordered { .. } => 3,
        }
    }

    /// The kind a trace record's code gives, on stream `stream` (a replay's key for the trace's
    /// stream number) when it was asynchronous.
    pub fn from_code(code: u16, stream: StreamKey) -> FreeKind {
        match code {
            1 => FreeKind::Async {
                blocking: true,
                stream,
            },
            2 => FreeKind::Async {
                blocking: false,
                stream,
            },
            3 => FreeKind::Ordered { stream },
            _ => FreeKind::Sync,
        }
    }
}

/// What happened to a pointer handed to `free`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeOutcome {
    /// A live block of ours: back in the pool.
    Freed,
    /// Inside pool memory but not a live block (double free, interior pointer): refused.
    Invalid,
    /// Not pool memory at all: the runtime should handle it.
    NotOurs,
}

/// What a free must wait for before its block is reused, by reuse mode and how it was freed.
pub fn need_for(reuse: ReuseMode, kind: FreeKind, beyond_barriers: bool) -> ReuseWait {
    match (reuse, kind) {
        (ReuseMode::Strict, _) | (_, FreeKind::Ordered { .. }) => ReuseWait::Fence,
        (
            _,
            FreeKind::Async {
                blocking: false, ..
            },
        ) => ReuseWait::Fence,
        // A barrier orders nothing of a non-blocking stream's work, nor of a context the program
        // made, and the block's next owner may use one: a stream-ordered free in `relaxed` mode
        // falls back too.
        (ReuseMode::Barrier, _) | (ReuseMode::Relaxed, FreeKind::Async { .. })
            if beyond_barriers =>
        {
            ReuseWait::Fence
        }
        (ReuseMode::Barrier, _) | (ReuseMode::Relaxed, FreeKind::Async { .. }) => {
            ReuseWait::Barrier
        }
        (ReuseMode::Relaxed, FreeKind::Sync) => ReuseWait::Nothing,
    }
}

/// The trace's code for a reuse mode.
pub fn reuse_code(reuse: ReuseMode) -> u16 {
    match reuse {
        ReuseMode::Strict => 0,
        ReuseMode::Barrier => 1,
        ReuseMode::Relaxed => 2,
    }
}

pub fn reuse_from_code(code: u16) -> ReuseMode {
    match code {
        1 => ReuseMode::Barrier,
        2 => ReuseMode::Relaxed,
        _ => ReuseMode::Strict,
    }
}
