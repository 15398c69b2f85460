//! The driver's contexts: whether `cuInit` was called, each device's primary context, and the
//! calling thread's context stack.
//!
//! Events belong to devices, not contexts. A context created by `cuCtxCreate_v2` shares its
//! device's capacity with the primary context; the device memory allocated while it is current
//! (`cuMemAlloc`, and `cudaMalloc` through the runtime, which uses the current context) is its
//! own, and `cuCtxDestroy_v2` frees it, as CUDA does. Virtual memory and memory pools' memory
//! are the device's and stay. Its streams are its own, as in CUDA: the ones it creates, and its
//! default streams (the NULL stream with it current is its own legacy stream, which orders
//! itself against its blocking streams alone). Its synchronization waits for them, and the
//! primary context's does not. The current context's device is the runtime's current device:
//! every change of the thread's stack moves `current`, and `cudaSetDevice` makes the device's
//! primary context current, as CUDA 12 does.
//!
//! A green context (`cuGreenCtxCreate`) has a context handle too (`cuCtxFromGreenCtx`), which a
//! thread may make current, and streams of its own ordered as a created context's are. Unlike
//! a created context, its memory is the primary context's (it owns no allocation), and the
//! primary context's synchronization waits for its streams, as CUDA documents for
//! `cuCtxSynchronize`.

use crate::config::{self, MAX_DEVICES};
use crate::current;
use crate::errors::{CudaResult, CU_INVALID_CONTEXT, CU_NOT_INITIALIZED, MEMORY_ALLOCATION};
use crate::handles::{self, CONTEXT_MAGIC, GREEN_MAGIC};
use crate::state::with_state;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// `cuInit`: from now on the driver answers.
pub fn initialize() -> CudaResult {
    config::get()?;
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// `CUDA_ERROR_NOT_INITIALIZED` until `cuInit`.
pub fn require_init() -> CudaResult {
    if INITIALIZED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(CU_NOT_INITIALIZED)
    }
}

/// The primary contexts' handles: the addresses of these bytes, fixed for the process, so
/// `cudaSetDevice` finds one without a lock.
static PRIMARY: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

/// The handle of device `d`'s primary context.
pub fn primary(d: usize) -> usize {
    &PRIMARY[d] as *const u8 as usize
}

/// The device whose primary context `handle` is.
fn primary_device(handle: usize) -> Option<usize> {
    let d = handle.checked_sub(primary(0))?;
    (d < MAX_DEVICES).then_some(d)
}

/// How many contexts a thread's stack holds; a push beyond gives `CUDA_ERROR_OUT_OF_MEMORY`.
pub const DEPTH: usize = 32;

/// A thread's context stack, each context with its device; the top is current. Cells of plain
/// numbers: the thread-local needs no destructor, so the stack outlives the thread's TLS
/// destructors, which glibc runs at `exit` before the `atexit` handlers that may still call
/// CUDA (NVIDIA's runtime serves them).
struct Stack {
    len: Cell<usize>,
    entries: [Cell<(usize, usize)>; DEPTH],
}

impl Stack {
    fn top(&self) -> Option<(usize, usize)> {
        let len = self.len.get();
        (len > 0).then(|| self.entries[len - 1].get())
    }

    fn pop(&self) -> Option<(usize, usize)> {
        let top = self.top()?;
        self.len.set(self.len.get() - 1);
        Some(top)
    }

    fn push(&self, entry: (usize, usize)) -> CudaResult {
        let len = self.len.get();
        let slot = self.entries.get(len).ok_or(MEMORY_ALLOCATION)?;
        slot.set(entry);
        self.len.set(len + 1);
        Ok(())
    }
}

thread_local! {
    static STACK: Stack = const {
        Stack {
            len: Cell::new(0),
            entries: [const { Cell::new((0, 0)) }; DEPTH],
        }
    };
}

/// The device of a live context; `CUDA_ERROR_INVALID_CONTEXT` for anything else (a destroyed
/// created context, a stray pointer).
pub fn device_of(handle: usize) -> CudaResult<usize> {
    let devices = config::get()?.devices;
    if let Some(d) = primary_device(handle) {
        return if d < devices {
            Ok(d)
        } else {
            Err(CU_INVALID_CONTEXT)
        };
    }
    with_state(|st| st.contexts.get(&handle).copied().ok_or(CU_INVALID_CONTEXT))
}

/// The current context, if any.
pub fn current_context() -> Option<usize> {
    STACK.with(|s| s.top().map(|(h, _)| h))
}

/// The current context when it is a created one (`cuCtxCreate_v2`), not a primary one.
pub fn created_current() -> Option<usize> {
    current_context().and_then(created)
}

/// `handle` when it is a created or green context's, not a primary one.
pub fn created(handle: usize) -> Option<usize> {
    primary_device(handle).is_none().then_some(handle)
}

/// Checks that a live context is current (after `cuInit`); the calls that act on "the current
/// context" then act on its device, the runtime's current device.
pub fn require_context() -> CudaResult {
    require_init()?;
    let handle = current_context().ok_or(CU_INVALID_CONTEXT)?;
    // A primary context never dies; a created one is looked up.
    if primary_device(handle).is_none() {
        device_of(handle)?;
    }
    Ok(())
}

/// Runs `f` on the thread's stack, then makes the new top's device current for the runtime.
fn with_stack<R>(f: impl FnOnce(&Stack) -> R) -> R {
    STACK.with(|stack| {
        let r = f(stack);
        if let Some((_, d)) = stack.top() {
            // The device is in range: it belongs to a live context.
            let _ = current::set(d as i32);
        }
        r
    })
}

/// `cuCtxSetCurrent`: replaces the top of the stack (NULL: pops it).
pub fn set_current(handle: usize) -> CudaResult {
    let entry = match handle {
        0 => None,
        h => Some((h, device_of(h)?)),
    };
    with_stack(|s| {
        s.pop();
        entry.map_or(Ok(()), |e| s.push(e))
    })
}

/// `cuCtxPushCurrent_v2`.
pub fn push(handle: usize) -> CudaResult {
    let d = device_of(handle)?;
    with_stack(|s| s.push((handle, d)))
}

/// `cuCtxPopCurrent_v2`: the context popped.
pub fn pop() -> CudaResult<usize> {
    with_stack(|s| s.pop())
        .map(|(h, _)| h)
        .ok_or(CU_INVALID_CONTEXT)
}

/// `cudaSetDevice`: makes device `d`'s primary context current (lock-free: thread-locals only).
pub fn set_device(d: usize) {
    STACK.with(|s| {
        s.pop();
        // Room for one: one was just popped, or the stack is empty.
        let _ = s.push((primary(d), d));
    });
}

/// What the runtime does before it calls the driver: a thread with no current context gets
/// its current device's primary context.
pub fn bind_runtime() {
    STACK.with(|s| {
        if s.top().is_none() {
            let d = current::get();
            // An empty stack has room.
            let _ = s.push((primary(d), d));
        }
    });
}

/// `cuCtxCreate_v2`: a new context of device `d`, pushed on the stack.
pub fn create(d: usize) -> CudaResult<usize> {
    let h = with_state(|st| {
        // Its bytes are the device's context's here; its device's primary context stays as it was.
        st.devices[d].context = true;
        let h = handles::create(CONTEXT_MAGIC);
        st.contexts.insert(h, d);
        st.streams.add_context(h, d, false);
        Ok(h)
    })?;
    if let Err(full) = with_stack(|s| s.push((h, d))) {
        // A context the caller never gets a handle to is not kept.
        destroy(h)?;
        return Err(full);
    }
    Ok(h)
}

/// `cuCtxDestroy_v2` of a created context (a primary one: `CUDA_ERROR_INVALID_CONTEXT`), and
/// the allocations made in it. It
/// is popped if it is the calling thread's current context; other threads that still have it
/// get `CUDA_ERROR_INVALID_CONTEXT`.
pub fn destroy(handle: usize) -> CudaResult {
    with_state(|st| {
        // A green context's handle goes with the green context (`cuGreenCtxDestroy`).
        if st.green_of(handle).is_some() {
            return Err(CU_INVALID_CONTEXT);
        }
        st.contexts.remove(&handle).ok_or(CU_INVALID_CONTEXT)?;
        st.streams.remove_context(handle);
        // CUDA frees the context's allocations with it.
        for base in st.allocs.of_context(handle) {
            st.destroy_allocation(base);
        }
        // SAFETY: a handle made by `handles::create`, now removed from its registry.
        unsafe { handles::destroy(handle) };
        Ok(())
    })?;
    with_stack(|s| {
        if s.top().is_some_and(|(h, _)| h == handle) {
            s.pop();
        }
    });
    Ok(())
}

/// `cuGreenCtxCreate`: a green context of device `d`, not made current. Its handle, and its
/// context handle (`cuCtxFromGreenCtx`), whose streams are the green context's. CUDA retains
/// the device's primary context for it, whatever context is current: the primary is active.
pub fn create_green(d: usize) -> CudaResult<(usize, usize)> {
    with_state(|st| {
        st.activate_primary(d);
        let ctx = handles::create(CONTEXT_MAGIC);
        let green = handles::create(GREEN_MAGIC);
        st.contexts.insert(ctx, d);
        st.green.insert(green, ctx);
        st.streams.add_context(ctx, d, true);
        Ok((green, ctx))
    })
}

/// The context handle of a live green context (`CUDA_ERROR_INVALID_CONTEXT` for anything else).
pub fn of_green(green: usize) -> CudaResult<usize> {
    with_state(|st| st.green.get(&green).copied().ok_or(CU_INVALID_CONTEXT))
}

/// `cuGreenCtxDestroy`: the green context and its context handle go; its work still runs, and
/// the primary context's synchronization waits for it. It is popped if it is the calling
/// thread's current context; other threads that still have it get `CUDA_ERROR_INVALID_CONTEXT`.
pub fn destroy_green(green: usize) -> CudaResult {
    let ctx = with_state(|st| {
        let ctx = st.green.remove(&green).ok_or(CU_INVALID_CONTEXT)?;
        st.contexts.remove(&ctx);
        st.streams.remove_context(ctx);
        // SAFETY: handles made by `handles::create`, now removed from their registries.
        unsafe {
            handles::destroy(ctx);
            handles::destroy(green);
        }
        Ok(ctx)
    })?;
    with_stack(|s| {
        if s.top().is_some_and(|(h, _)| h == ctx) {
            s.pop();
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_handles_name_their_device() {
        assert_eq!(primary_device(primary(0)), Some(0));
        assert_eq!(primary_device(primary(71)), Some(71));
        assert_eq!(primary_device(primary(0) + MAX_DEVICES), None);
        assert_eq!(primary_device(primary(0) - 1), None);
    }
}
