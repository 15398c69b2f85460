//! Simulated kernels: `cudaLaunchKernel` of `cudasim_fill_kernel`.

use super::CudaStream;
use crate::current;
use crate::errors::{CudaResult, INVALID_DEVICE_FUNCTION, INVALID_RESOURCE_HANDLE, INVALID_VALUE};
use crate::faults::Func;
use crate::ffi::{boundary, runtime_call};
use crate::link;
use crate::state::with_state;
use crate::timeline::{self, Completion};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;

/// `dim3`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Dim3 {
    pub x: c_uint,
    pub y: c_uint,
    pub z: c_uint,
}

/// The simulated kernel's "function pointer". Calling it does nothing.
#[no_mangle]
pub unsafe extern "C" fn cudasim_fill_kernel() {
    // A distinctive body, so the linker never folds it with another function.
    boundary((), || {
        std::hint::black_box(0xC0DA_51A1_u32);
    })
}

/// Whether `func` is `cudasim_fill_kernel`: our own address, or the one the dynamic linker
/// gives programs (they may differ when a program's canonical address is a PLT entry).
fn is_fill_kernel(func: usize) -> bool {
    static RESOLVED: OnceLock<usize> = OnceLock::new();
    let resolved = *RESOLVED.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the symbol
        // tables of loaded objects.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"cudasim_fill_kernel".as_ptr()) as usize }
    });
    func != 0 && (func == cudasim_fill_kernel as *const () as usize || func == resolved)
}

/// The arguments of the fill kernel.
struct FillArgs {
    buffer: usize,
    bytes: usize,
    usec: c_uint,
    fill: c_int,
}

/// Reads `args[0..4]`: `void*` buffer, `size_t` bytes, `unsigned` microseconds, `int` fill.
///
/// # Safety
/// `args` must be NULL or point to 4 pointers, each NULL or pointing to a value of its type.
unsafe fn read_args(args: *mut *mut c_void) -> CudaResult<FillArgs> {
    if args.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller guarantees 4 readable pointers at `args`.
    let ptrs = unsafe { std::slice::from_raw_parts(args, 4) };
    if ptrs.iter().any(|p| p.is_null()) {
        return Err(INVALID_VALUE);
    }
    // SAFETY: each pointer is not NULL and, by the caller's contract, points to its type.
    unsafe {
        Ok(FillArgs {
            buffer: *(ptrs[0] as *const *mut c_void) as usize,
            bytes: *(ptrs[1] as *const usize),
            usec: *(ptrs[2] as *const c_uint),
            fill: *(ptrs[3] as *const c_int),
        })
    }
}

fn launch(func: usize, args: CudaResult<FillArgs>, stream: CudaStream) -> CudaResult {
    if !is_fill_kernel(func) {
        return Err(INVALID_DEVICE_FUNCTION);
    }
    let a = args?;
    with_state(|st| {
        let id = st.stream(stream as usize)?;
        let device = st.streams.get(id).device;
        if a.bytes > 0 {
            // A kernel that fills writes its range; one that does not only reads it.
            st.check_device_range(a.buffer, a.bytes, device, a.fill != -1)?;
        }
        // CUDA: a launch fails if its stream is not associated with the current device.
        if device != current::get() {
            return Err(INVALID_RESOURCE_HANDLE);
        }
        st.use_device(device).counters.kernels_launched += 1;
        let duration = timeline::micros(u64::from(a.usec));
        let end = st.streams.enqueue(id, timeline::now(), duration, 0);
        let fill = (a.fill != -1).then_some(a.fill as u8);
        st.queue.push(
            end,
            Completion::Kernel {
                device,
                base: a.buffer,
                len: a.bytes,
                fill,
            },
        );
        Ok(())
    })
}

/// Through the driver (`cuLaunchKernel`, the fill kernel's address as its `CUfunction`).
/// Grid and block dimensions and the shared memory size are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cudaLaunchKernel(
    func: *const c_void,
    grid_dim: Dim3,
    block_dim: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: CudaStream,
) -> c_int {
    // SAFETY: forwarded from the caller.
    runtime_call(Func::cudaLaunchKernel, || unsafe {
        launch_call(func, grid_dim, block_dim, args, shared_mem, stream)
    })
}

/// What `<<<...>>>` compiles to since CUDA 13 (a `cudaKernel_t` handle first); the simulator
/// takes the fill kernel's address as its handle.
#[no_mangle]
pub unsafe extern "C" fn __cudaLaunchKernel(
    kernel: *const c_void,
    grid_dim: Dim3,
    block_dim: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: CudaStream,
) -> c_int {
    // SAFETY: forwarded from the caller.
    runtime_call(Func::__cudaLaunchKernel, || unsafe {
        launch_call(kernel, grid_dim, block_dim, args, shared_mem, stream)
    })
}

/// A runtime launch: any function but the fill kernel is refused here, as the runtime refuses
/// a function it has no module for; the fill kernel goes to the driver.
///
/// # Safety
/// For the fill kernel, `args` holds its 4 arguments as documented.
unsafe fn launch_call(
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: CudaStream,
) -> CudaResult {
    match link::driver() {
        Some(d) if is_fill_kernel(func as usize) => {
            // SAFETY: the driver's cuLaunchKernel, given the caller's arguments.
            link::result(unsafe {
                (d.launch_kernel)(
                    func.cast_mut(),
                    grid.x,
                    grid.y,
                    grid.z,
                    block.x,
                    block.y,
                    block.z,
                    shared_mem as c_uint,
                    stream,
                    args,
                    std::ptr::null_mut(),
                )
            })
        }
        // SAFETY: forwarded from the caller.
        _ => unsafe { launch_fill(func, args, stream) },
    }
}

/// Launches `func` if it is the fill kernel (`cudaErrorInvalidDeviceFunction` otherwise):
/// the runtime's launches without a driver, and `cuLaunchKernel`.
///
/// # Safety
/// For the fill kernel, `args` holds its 4 arguments as documented.
pub unsafe fn launch_fill(
    func: *const c_void,
    args: *mut *mut c_void,
    stream: CudaStream,
) -> CudaResult {
    // Other functions' arguments are not read (the launch fails first).
    let args = if is_fill_kernel(func as usize) {
        // SAFETY: for the fill kernel, the caller passes its 4 arguments as documented.
        unsafe { read_args(args) }
    } else {
        Err(INVALID_DEVICE_FUNCTION)
    };
    launch(func as usize, args, stream)
}
