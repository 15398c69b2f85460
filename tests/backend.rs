//! The pool's CUDA backend (`src/cuda/backend.rs`) called directly, in this process, on the
//! simulator's runtime: what it does about a device when another one is current.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;

use std::ffi::{c_int, c_void, CString};

use gpupool::cuda::backend::{runtime_found, CudaBackend};
use gpupool::cuda::runtime::Runtime;
use gpupool::pool::Backend;
use sim::Sim;

/// `cudasimStats` up to `stream_wait_events` (`cudasim/include/cudasim.h`): a smaller
/// `struct_size` is what an older caller passes.
#[repr(C)]
#[derive(Default)]
struct Stats {
    struct_size: usize,
    malloc_calls: u64,
    malloc_failures: u64,
    free_calls: u64,
    live_allocations: u64,
    live_bytes: u64,
    peak_live_bytes: u64,
    device_syncs: u64,
    stream_syncs: u64,
    event_syncs: u64,
    implicit_syncs: u64,
    event_records: u64,
    stream_wait_events: u64,
}

/// The simulator's runtime, opened here with two devices.
struct Simulator(*mut c_void);

impl Simulator {
    fn open() -> Simulator {
        // Read at the simulator's first call.
        std::env::set_var("CUDASIM_DEVICES", "2");
        let path = CString::new(Sim::get().simlib.join("libcudart.so.12").to_str().unwrap());
        // SAFETY: a NUL-terminated path; the library has no constructor that needs more.
        let handle = unsafe { libc::dlopen(path.unwrap().as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "dlopen of the simulator");
        Simulator(handle)
    }

    fn symbol(&self, name: &[u8]) -> *mut c_void {
        // SAFETY: a live handle and a NUL-terminated name.
        unsafe { libc::dlsym(self.0, name.as_ptr().cast()) }
    }

    /// Function `name` (NUL-terminated) as `F`.
    ///
    /// # Safety
    /// `F` is the function's C signature.
    unsafe fn function<F: Copy>(&self, name: &[u8]) -> F {
        let p = self.symbol(name);
        assert!(!p.is_null(), "{}", String::from_utf8_lossy(name));
        // SAFETY: a function of that name, whose signature the caller vouches for.
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
    }

    fn stats(&self, device: c_int) -> Stats {
        // SAFETY: `cudasimGetStats`'s signature.
        let get: unsafe extern "C" fn(c_int, *mut Stats) -> c_int =
            unsafe { self.function(b"cudasimGetStats\0") };
        let mut st = Stats {
            struct_size: std::mem::size_of::<Stats>(),
            ..Stats::default()
        };
        // SAFETY: a valid out-pointer whose `struct_size` says how much may be written.
        assert_eq!(unsafe { get(device, &mut st) }, 0);
        st
    }
}

/// A barrier for device 1 taken with device 0 current: the event is recorded on device 1's
/// legacy stream and waited on there (the blocking streams of device 1 are ordered after it),
/// nothing happens on device 0, and device 0 is current again after.
#[test]
fn a_barrier_for_another_device_than_the_current_one_is_taken_on_its_own_device() {
    let sim = Simulator::open();
    let rt = Runtime::resolve(&|name| sim.symbol(name)).expect("the simulator's runtime");
    runtime_found(rt);
    // SAFETY: the runtime's signatures.
    let set_device: unsafe extern "C" fn(c_int) -> c_int =
        unsafe { sim.function(b"cudaSetDevice\0") };
    // SAFETY: as above.
    let get_device: unsafe extern "C" fn(*mut c_int) -> c_int =
        unsafe { sim.function(b"cudaGetDevice\0") };
    // SAFETY: a valid ordinal.
    assert_eq!(unsafe { set_device(0) }, 0);
    let backend = CudaBackend::new();
    let (zero, one) = (sim.stats(0), sim.stats(1));
    for _ in 0..2 {
        assert_eq!(backend.barrier(1), Ok(()));
    }
    let (zero_after, one_after) = (sim.stats(0), sim.stats(1));
    let moved = |a: &Stats, b: &Stats| {
        (
            b.event_records - a.event_records,
            b.stream_wait_events - a.stream_wait_events,
        )
    };
    assert_eq!(moved(&one, &one_after), (2, 2), "on device 1");
    assert_eq!(moved(&zero, &zero_after), (0, 0), "on device 0");
    let mut current = -1;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { get_device(&mut current) }, 0);
    assert_eq!(current, 0, "the caller's device is current again");
    // Device 1's own barrier, with it current, uses the same event.
    // SAFETY: a valid ordinal.
    assert_eq!(unsafe { set_device(1) }, 0);
    assert_eq!(backend.barrier(1), Ok(()));
    assert_eq!(moved(&one, &sim.stats(1)), (3, 3));
}
