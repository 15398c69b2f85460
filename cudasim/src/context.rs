//! The driver's contexts: whether `cuInit` was called, each device's primary context, and the
//! calling thread's context stack.
//!
//! Events and default streams belong to devices, not contexts. A context created by
//! `cuCtxCreate_v2` shares its device's capacity with the primary context; the device memory
//! allocated while it is current (`cuMemAlloc`, and `cudaMalloc` through the runtime, which
//! uses the current context) is its own, and `cuCtxDestroy_v2` frees it, as CUDA does. Virtual
//! memory and memory pools' memory are the device's and stay. The streams
//! it creates are its own: its synchronization waits for them and the default streams, and
//! the primary context's does not wait for them. The current context's device is the runtime's current device: every change of the thread's stack moves
//! `current`, and `cudaSetDevice` makes the device's primary context current, as CUDA 12 does.

use crate::config::{self, MAX_DEVICES};
use crate::current;
use crate::errors::{CudaResult, CU_INVALID_CONTEXT, CU_NOT_INITIALIZED};
use crate::handles::{self, CONTEXT_MAGIC};
use crate::state::with_state;
use std::cell::RefCell;
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

thread_local! {
    /// The calling thread's context stack, with each context's device; the top is current.
    static STACK: RefCell<Vec<(usize, usize)>> = const { RefCell::new(Vec::new()) };
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
    STACK
        .try_with(|s| s.borrow().last().map(|&(h, _)| h))
        .ok()
        .flatten()
}

/// The current context when it is a created one (`cuCtxCreate_v2`), not a primary one.
pub fn created_current() -> Option<usize> {
    current_context().filter(|&h| primary_device(h).is_none())
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
/// A thread being torn down has no stack: `f` is not run.
fn with_stack<R: Default>(f: impl FnOnce(&mut Vec<(usize, usize)>) -> R) -> R {
    STACK
        .try_with(|s| {
            let mut stack = s.borrow_mut();
            let r = f(&mut stack);
            if let Some(&(_, d)) = stack.last() {
                // The device is in range: it belongs to a live context.
                let _ = current::set(d as i32);
            }
            r
        })
        .unwrap_or_default()
}

/// `cuCtxSetCurrent`: replaces the top of the stack (NULL: pops it).
pub fn set_current(handle: usize) -> CudaResult {
    let entry = match handle {
        0 => None,
        h => Some((h, device_of(h)?)),
    };
    with_stack(|s| {
        s.pop();
        s.extend(entry);
    });
    Ok(())
}

/// `cuCtxPushCurrent_v2`.
pub fn push(handle: usize) -> CudaResult {
    let d = device_of(handle)?;
    with_stack(|s| s.push((handle, d)));
    Ok(())
}

/// `cuCtxPopCurrent_v2`: the context popped.
pub fn pop() -> CudaResult<usize> {
    with_stack(|s| s.pop())
        .map(|(h, _)| h)
        .ok_or(CU_INVALID_CONTEXT)
}

/// `cudaSetDevice`: makes device `d`'s primary context current (lock-free: thread-locals only).
pub fn set_device(d: usize) {
    let _ = STACK.try_with(|s| {
        let mut stack = s.borrow_mut();
        stack.pop();
        stack.push((primary(d), d));
    });
}

/// What the runtime does before it calls the driver: a thread with no current context gets
/// its current device's primary context.
pub fn bind_runtime() {
    let _ = STACK.try_with(|s| {
        let mut stack = s.borrow_mut();
        if stack.is_empty() {
            let d = current::get();
            stack.push((primary(d), d));
        }
    });
}

/// `cuCtxCreate_v2`: a new context of device `d`, pushed on the stack.
pub fn create(d: usize) -> CudaResult<usize> {
    let h = with_state(|st| {
        st.use_device(d);
        let h = handles::create(CONTEXT_MAGIC);
        st.contexts.insert(h, d);
        Ok(h)
    })?;
    with_stack(|s| s.push((h, d)));
    Ok(h)
}

/// `cuCtxDestroy_v2` of a created context (a primary one: `CUDA_ERROR_INVALID_CONTEXT`), and
/// the allocations made in it. It
/// is popped if it is the calling thread's current context; other threads that still have it
/// get `CUDA_ERROR_INVALID_CONTEXT`.
pub fn destroy(handle: usize) -> CudaResult {
    with_state(|st| {
        st.contexts.remove(&handle).ok_or(CU_INVALID_CONTEXT)?;
        // CUDA frees the context's allocations with it.
        for base in st.allocs.of_context(handle) {
            st.destroy_allocation(base);
        }
        // SAFETY: a handle made by `handles::create`, now removed from its registry.
        unsafe { handles::destroy(handle) };
        Ok(())
    })?;
    with_stack(|s| {
        if s.last().is_some_and(|&(h, _)| h == handle) {
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
