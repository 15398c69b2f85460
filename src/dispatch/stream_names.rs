//! The pool's names for streams (`StreamKey`): when a call names its stream, what the name is,
//! and whether the stream is being captured into a graph or ordered with the legacy stream.

use crate::cuda::runtime::Runtime;
use crate::cuda::types::*;
use crate::guard;
use crate::pool::{Backend, Pool, StreamKey, LEGACY_STREAM, NO_STREAM};

use super::own_query;

/// Whether work on `stream` is ordered with the legacy stream (false when the runtime cannot
/// say: its frees then wait for a fence).
pub(super) fn stream_is_blocking(rt: &Runtime, stream: Stream) -> bool {
    let s = stream as usize;
    if s == 0 || s == STREAM_LEGACY || s == STREAM_PER_THREAD {
        return true;
    }
    let Some(get_flags) = rt.stream_get_flags else {
        return false;
    };
    let mut flags = 0u32;
    // SAFETY: a stream handle the program passed, and a valid out-pointer.
    let r = own_query(rt, unsafe { get_flags(stream, &mut flags) });
    r == SUCCESS && flags & STREAM_NON_BLOCKING == 0
}

/// Whose promise a stream-ordered call carries, which says when its stream is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promise {
    /// The pool's own API and PyTorch's pluggable allocator: named only where the reuse mode
    /// uses the name (`Pool::names_streams`).
    Pool,
    /// The runtime's `cudaMallocAsync`/`cudaFreeAsync`, whose contract orders every use of a
    /// block on its stream: named in every mode (`FreeKind::Ordered`).
    Runtime,
}

/// The pool's name for `stream` (`StreamKey`), when `pool` uses names (`Pool::names_streams`) or
/// the call carries the runtime's `promise`:
/// the runtime's unique id of the stream (`cudaStreamGetId`), never reused, so a stream created
/// after another was destroyed, even at the same handle, is another stream (the destroyed one's
/// work may still run). NULL and `cudaStreamLegacy` are the legacy default stream,
/// `cudaStreamPerThread` the calling thread's own. `NO_STREAM` when the runtime cannot say
/// (before CUDA 12, or a call that fails) or the stream is being captured into a graph (where
/// the query may not be allowed, and would then invalidate the capture; cudaStreamIsCapturing
/// is made to be asked then): then no stream-ordered reuse.
///
/// The legacy stream is named without asking: it is never destroyed nor captured (the runtime
/// refuses to capture it), and each device's pool has its own names. It is PyTorch's stream,
/// so its allocations and frees save two runtime calls each.
#[inline(always)]
pub(super) fn stream_key<B: Backend>(
    rt: &Runtime,
    pool: &Pool<B>,
    stream: Stream,
    promise: Promise,
) -> StreamKey {
    match stream_key_known(rt, pool, stream, promise) {
        Some(key) => key,
        None => match stream_key_asked(rt, stream, None) {
            Ok(key) => key.unwrap_or(NO_STREAM),
            Err(refused) => {
                own_query(rt, refused);
                NO_STREAM
            }
        },
    }
}

/// `stream_key` when the runtime must be asked: `Ok(None)` when it says the stream is being
/// captured into a graph, `Err` with its refusal of a stream it does not know (one the program
/// destroyed), left the last error as the runtime's own refusal would. A stream-ordered free
/// answers that refusal: the runtime's own `cudaFreeAsync` refuses such a stream and frees
/// nothing. `known`, the stream's id when a free knows it (`free_stream_key_asked`): the
/// capture is asked all the same, since a capture may begin where the pool does not see it;
/// the id is not.
#[inline(never)]
pub(super) fn stream_key_asked(
    rt: &Runtime,
    stream: Stream,
    known: Option<StreamKey>,
) -> Result<Option<StreamKey>, CudaStatus> {
    match capture_status(rt, stream) {
        Ok(Some(true)) => Ok(None),
        Ok(Some(false)) => Ok(Some(known.unwrap_or_else(|| stream_id(rt, stream)))),
        Ok(None) => Ok(Some(NO_STREAM)),
        Err(ERROR_INVALID_RESOURCE_HANDLE) => Err(ERROR_INVALID_RESOURCE_HANDLE),
        Err(other) => {
            // Any other refusal cannot say: no stream-ordered reuse.
            own_query(rt, other);
            Ok(Some(NO_STREAM))
        }
    }
}

/// `stream_key_asked` for a stream-ordered free: the id this thread's last stream-ordered
/// allocation asked for the same stream (`remember`) is not asked again.
#[inline(never)]
pub(super) fn free_stream_key_asked(
    rt: &Runtime,
    stream: Stream,
) -> Result<Option<StreamKey>, CudaStatus> {
    stream_key_asked(rt, stream, remembered_for_free(stream))
}

/// The id a stream-ordered free on `stream`, the runtime's or the driver's, takes without
/// asking: the one this thread's last stream-ordered allocation of either API asked for the
/// same handle (`remember`), the two APIs' ids being the same ids. `None`: the free asks. A
/// free never keeps the id it asked: a thread that only frees on a stream would then name it
/// by its first free's answer for good, and a stream made later at the same handle would never
/// get its own blocks back in stream order. An allocation asks every time, so the thread's
/// next one on the handle corrects a name gone stale. Its own thread-local access, made only
/// by frees that ask about capture anyway.
pub(super) fn remembered_for_free(stream: Stream) -> Option<StreamKey> {
    guard::last_stream().and_then(|last| remembered(last, stream))
}

/// Keeps `key`, the id of `stream` a stream-ordered allocation (`cudaMallocAsync` or
/// `cuMemAllocAsync`) just asked, for this thread's next stream-ordered free on it
/// (`remembered`). Only inside the pool (`inside`): a signal handler's call is refused before
/// it gets here, so it cannot tear the pair that an interrupted free is reading. Not the
/// per-thread default stream: one handle, a stream per thread and device; nor a name that was
/// not asked for.
pub(super) fn remember(inside: &guard::Inside, stream: Stream, key: StreamKey) {
    let s = stream as usize;
    if s != STREAM_PER_THREAD && !is_legacy(stream) && key != NO_STREAM && key != LEGACY_STREAM {
        inside.set_last_stream((s, key));
    }
}

/// The id this thread's last stream-ordered allocation asked for `stream` (`last`, from
/// `remember`), for a stream-ordered free only: a program's pairs on one stream then ask its
/// id once. The program may have destroyed that stream since and made another at its handle
/// (handles are reused, ids never): the id is then the destroyed stream's, which no allocation
/// names again, so the block waits for what a block freed on an unnamed stream waits for (a
/// fence, or a barrier), until the thread's next allocation there asks again. An allocation
/// must never take a destroyed stream's name, which would give it that stream's blocks while
/// its work may still run: it asks every time.
fn remembered(last: (usize, u64), stream: Stream) -> Option<StreamKey> {
    let (handle, key) = last;
    (handle == stream as usize && key != NO_STREAM).then_some(key)
}

/// The pool's name for `stream` for `cudaMallocAsync` (the runtime's promise), or `None` when
/// the allocation passes through: the stream is being captured into a graph (the graph owns
/// it), or the runtime cannot say whether it is. One capture question, whose answer also
/// decides the name. The legacy stream is never asked: CUDA refuses to capture it. What needs
/// no runtime call inlined (the legacy stream, PyTorch's), the questions apart.
#[inline(always)]
pub(crate) fn async_stream_key<B: Backend>(
    rt: &Runtime,
    pool: &Pool<B>,
    stream: Stream,
) -> Option<StreamKey> {
    match stream_key_known(rt, pool, stream, Promise::Runtime) {
        Some(key) if is_legacy(stream) || rt.stream_is_capturing.is_none() => Some(key),
        known => async_stream_key_asked(rt, stream, known),
    }
}

/// `async_stream_key` when the runtime must be asked: `known` is the name that needs no
/// question, if any (`NO_STREAM` where the runtime has no `cudaStreamGetId`).
#[inline(never)]
fn async_stream_key_asked(
    rt: &Runtime,
    stream: Stream,
    known: Option<StreamKey>,
) -> Option<StreamKey> {
    if captured(rt, stream) != Some(false) {
        return None;
    }
    Some(known.unwrap_or_else(|| stream_id(rt, stream)))
}

/// Whether the runtime says `stream` is being captured into a graph (`cudaStreamIsCapturing`);
/// `None` when it cannot say.
fn captured(rt: &Runtime, stream: Stream) -> Option<bool> {
    capture_status(rt, stream).unwrap_or_else(|refused| {
        own_query(rt, refused);
        None
    })
}

/// The runtime's answer to `cudaStreamIsCapturing` for `stream`: `Ok(None)` where it has no
/// such call, `Err` with its refusal, left the last error.
fn capture_status(rt: &Runtime, stream: Stream) -> Result<Option<bool>, CudaStatus> {
    let Some(is_capturing) = rt.stream_is_capturing else {
        return Ok(None);
    };
    let mut capturing = -1;
    // SAFETY: a stream handle the program passed, and a valid out-pointer.
    match unsafe { is_capturing(stream, &mut capturing) } {
        SUCCESS => Ok(Some(capturing != 0)),
        refused => Err(refused),
    }
}

/// The runtime's unique id of `stream` (`cudaStreamGetId`), `NO_STREAM` when it cannot say.
fn stream_id(rt: &Runtime, stream: Stream) -> StreamKey {
    let Some(get_id) = rt.stream_get_id else {
        return NO_STREAM;
    };
    let mut id = 0u64;
    // SAFETY: a stream handle the program passed, and a valid out-pointer.
    match own_query(rt, unsafe { get_id(stream, &mut id) }) {
        SUCCESS if id != NO_STREAM => id,
        _ => NO_STREAM,
    }
}

/// `stream_key` when it needs no runtime call: `None` when the runtime must be asked. A
/// runtime without stream ids (before CUDA 12) is still asked about capture where the call
/// carries its promise: a block freed into a graph must be kept out of use all the same.
#[inline(always)]
pub(super) fn stream_key_known<B: Backend>(
    rt: &Runtime,
    pool: &Pool<B>,
    stream: Stream,
    promise: Promise,
) -> Option<StreamKey> {
    let named = promise == Promise::Runtime || pool.names_streams();
    let no_ids = promise == Promise::Pool && rt.stream_get_id.is_none();
    if !named || rt.stream_is_capturing.is_none() || no_ids {
        Some(NO_STREAM)
    } else if is_legacy(stream) {
        Some(LEGACY_STREAM)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeviceBytes, ReuseMode};
    use crate::pool::model_driver::ModelDriver;
    use crate::pool::Settings;
    use std::ffi::c_void;

    /// Stands for every runtime function the tests below do not call.
    extern "C" fn never_called() {
        unreachable!("a runtime function the test does not call")
    }

    /// Says every stream is being captured.
    unsafe extern "C" fn capturing(_: Stream, status: *mut i32) -> CudaStatus {
        // SAFETY: the pool passes a valid out-pointer.
        unsafe { *status = 1 };
        SUCCESS
    }

    /// A runtime of CUDA 11: `cudaStreamIsCapturing`, no `cudaStreamGetId`.
    fn cuda_11_runtime() -> Runtime {
        let lookup = |name: &[u8]| match name {
            b"cudaStreamGetId\0" => std::ptr::null_mut(),
            b"cudaStreamIsCapturing\0" => capturing as *mut c_void,
            _ => never_called as *mut c_void,
        };
        Runtime::resolve(&lookup).expect("every required name resolves")
    }

    /// A free takes only an id an allocation asked for the same created stream: never one for
    /// a default stream (the per-thread one is a stream per thread and device) nor a name the
    /// runtime was not asked for; and the last allocation's, not an earlier one's.
    #[test]
    fn a_free_takes_the_id_the_last_allocation_asked_for_its_created_stream() {
        let inside = guard::enter().expect("a test thread starts outside the pool");
        let known = |stream: usize| remembered_for_free(stream as Stream);
        for (stream, key) in [
            (STREAM_PER_THREAD, 5),
            (0, 6),
            (STREAM_LEGACY, 7),
            (0x1000, NO_STREAM),
            (0x1000, LEGACY_STREAM),
        ] {
            remember(&inside, stream as Stream, key);
            assert_eq!(known(stream), None, "stream {stream:#x}, key {key}");
        }
        remember(&inside, 0x1000 as Stream, 9);
        assert_eq!(known(0x1000), Some(9));
        assert_eq!(known(0x2000), None, "another handle");
        remember(&inside, 0x2000 as Stream, 10);
        assert_eq!((known(0x1000), known(0x2000)), (None, Some(10)));
    }

    /// Before CUDA 12 a `cudaFreeAsync` still asks whether its stream is being captured, and
    /// a captured one is told apart (the free keeps its block out of use); a stream the pool
    /// names only where the mode uses names is not asked at all.
    #[test]
    fn without_stream_ids_a_stream_ordered_free_still_asks_about_capture() {
        let rt = cuda_11_runtime();
        let pool = Pool::new(
            ModelDriver::new(),
            Settings::for_tests(ReuseMode::Strict, DeviceBytes::Unbounded, false),
        );
        let stream = 0x1000 as Stream;
        assert_eq!(stream_key_known(&rt, &pool, stream, Promise::Runtime), None);
        assert_eq!(stream_key_asked(&rt, stream, None), Ok(None), "captured");
        assert_eq!(
            stream_key_asked(&rt, stream, Some(7)),
            Ok(None),
            "captured, id known"
        );
        assert_eq!(
            stream_key_known(&rt, &pool, std::ptr::null_mut(), Promise::Runtime),
            Some(LEGACY_STREAM)
        );
        assert_eq!(
            stream_key_known(&rt, &pool, stream, Promise::Pool),
            Some(NO_STREAM)
        );
    }
}
