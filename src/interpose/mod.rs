//! The exported `dlsym`: how the driver hooks reach programs that find the driver themselves.
//!
//! A program linked with the static CUDA runtime (nvcc's default), and every library that
//! carries one (cuBLAS, cuFFT, NCCL), `dlopen`s `libcuda.so.1` and takes `cuGetProcAddress_v2`
//! with `dlsym`; XLA takes the driver's functions with `dlsym` directly. An unversioned `dlsym`
//! in a preloaded library interposes both `dlsym@GLIBC_2.34` and `dlsym@GLIBC_2.2.5`.
//!
//! Nearly every lookup is glibc's alone: the entry point is a few instructions that jump to
//! glibc's `dlsym` with the caller's own return address still on the stack, since glibc
//! resolves `RTLD_NEXT` (and the caller's namespace) from it. Only the lookup of a driver name
//! (`cu` and a capital letter) by a caller other than a CUDA runtime library is looked at: glibc
//! is asked on the caller's behalf and a driver function the library hooks is swapped for its
//! hook (`hooks::driver::swap`), by the function's identity. `RTLD_NEXT` lookups are never
//! swapped (they name "the next definition after the caller"). A failed lookup is repeated by
//! glibc for the caller, so `dlerror()` reads as it would without the library.
//!
//! A runtime library (one that defines `cudaMalloc` itself, as `libcudart.so` does) is left
//! its driver functions: its own entry points are the runtime hooks' business, and its
//! internal driver calls (the pool's segments among them) must not come back to the pool.
//!
//! Only on x86-64 Linux (glibc); elsewhere the library exports no `dlsym`, and the driver hooks
//! are reached by symbol only (`-lcuda`).
//!
//! The library also exports `dlclose` (`dlclose.rs`), for the reports: the blocks a library
//! allocated keep its name once it is unloaded. Also only on x86-64 Linux, where glibc's is
//! `dlclose@GLIBC_2.34` or `@GLIBC_2.2.5` (other architectures have other base versions).

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod dlclose;

use std::ffi::{c_char, c_void, CStr};

use crate::cuda::dl;
use crate::cuda::hooked;
use crate::guard::boundary;
use crate::hooks::driver::swap;

/// Whether `name` is a driver API name: `cu` and a capital letter (`cuMemAlloc_v2`, not
/// `cudaMalloc`).
fn is_driver_name(name: &[u8]) -> bool {
    name.len() > 2 && name.starts_with(b"cu") && name[2].is_ascii_uppercase()
}

/// Whether the object at `base` (named `path`, the dynamic linker's name) defines `cudaMalloc`
/// itself: a CUDA runtime library, or this library. Never the main program (its name is empty),
/// which the pool never takes its runtime from: it is not opened by its `argv[0]`, which may
/// name another file or a FIFO that opening would block on.
fn is_runtime_library(base: *mut c_void, path: *const c_char) -> bool {
    if base == own_base() {
        return true;
    }
    // SAFETY: a NUL-terminated name owned by the dynamic linker.
    if unsafe { *path } == 0 {
        return false;
    }
    // SAFETY: `path` is the dynamic linker's NUL-terminated name of a loaded object;
    // RTLD_NOLOAD only opens what is loaded already.
    let h = unsafe { libc::dlopen(path, libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        // Not opened by its name: no runtime the pool takes its calls to.
        return false;
    }
    // SAFETY: a live handle and a NUL-terminated name.
    let malloc = unsafe { dl::real_dlsym(h, c"cudaMalloc".as_ptr()) };
    // SAFETY: the handle just opened, closed once.
    unsafe { dl::close(h) };
    !malloc.is_null() && dl::object_of(malloc as usize).is_some_and(|(b, _)| b == base)
}

/// This library's load address.
fn own_base() -> *mut c_void {
    dl::object_of(own_base as *const () as usize).map_or(std::ptr::null_mut(), |o| o.0)
}

/// What the exported `dlsym` answers for `(handle, name)` asked from `caller`: a swapped
/// function, or null for "glibc answers" (the entry point then jumps to the next `dlsym`, glibc's
/// or another preloaded library's, which `dl::NEXT_DLSYM` holds once this returns).
extern "C" fn dlsym_decide(
    handle: *mut c_void,
    name: *const c_char,
    caller: *const c_void,
) -> *mut c_void {
    let real = dl::find_real_dlsym();
    if real.is_null() || name.is_null() || handle == libc::RTLD_NEXT {
        return std::ptr::null_mut();
    }
    boundary(std::ptr::null_mut(), || {
        // SAFETY: a non-NULL name the caller passed to dlsym, NUL-terminated by its contract.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        if !is_driver_name(bytes) || !hooked::swapping() {
            return std::ptr::null_mut();
        }
        match dl::linked_object_of(caller as usize) {
            Some((base, path)) if !is_runtime_library(base, path) => {}
            _ => return std::ptr::null_mut(),
        }
        // The functions behind the hooks, looked up here, inside the program's own lookup.
        hooked::resolve_here();
        // SAFETY: the caller's arguments; `real_dlsym` is glibc's.
        let found = unsafe { dl::real_dlsym(handle, name) };
        let swapped = swap(found);
        if swapped == found {
            // glibc answers the caller itself: same answer, same dlerror state.
            std::ptr::null_mut()
        } else {
            swapped
        }
    })
}

/// # Safety
/// As glibc's `dlsym`.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // Save the arguments, ask `dlsym_decide` with the caller's return address (at [rsp] on
    // entry), and return its answer; or restore the arguments and the stack exactly and jump to
    // glibc's dlsym, which then sees the caller's return address as its own.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "push rdi",
        ".cfi_adjust_cfa_offset 8",
        "push rsi",
        ".cfi_adjust_cfa_offset 8",
        "sub rsp, 8",
        ".cfi_adjust_cfa_offset 8",
        "mov rdx, qword ptr [rsp + 24]",
        "call {decide}",
        "add rsp, 8",
        ".cfi_adjust_cfa_offset -8",
        "pop rsi",
        ".cfi_adjust_cfa_offset -8",
        "pop rdi",
        ".cfi_adjust_cfa_offset -8",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "mov r11, qword ptr [rip + {real}@GOTPCREL]",
        "jmp qword ptr [r11]",
        ".cfi_endproc",
        decide = sym dlsym_decide,
        real = sym dl::NEXT_DLSYM,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_are_cu_and_a_capital() {
        assert!(is_driver_name(b"cuMemAlloc_v2"));
        assert!(is_driver_name(b"cuGetProcAddress_v2"));
        assert!(!is_driver_name(b"cudaMalloc"));
        assert!(!is_driver_name(b"cu"));
        assert!(!is_driver_name(b"cublasCreate_v2"));
        assert!(!is_driver_name(b"curand"));
    }
}
