//! The host memory behind virtual memory management: reserved address space is an inaccessible
//! anonymous mapping, physical memory is a memfd, and mapping a handle maps its memfd shared
//! over part of a reservation, so every mapping of one handle shows the same bytes.

use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};

/// Bytes readable and writable through a mapping, as `mprotect` takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prot {
    None,
    Read,
    ReadWrite,
}

impl Prot {
    fn bits(self) -> libc::c_int {
        match self {
            Prot::None => libc::PROT_NONE,
            Prot::Read => libc::PROT_READ,
            Prot::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        }
    }
}

/// Reserves `size` bytes of address space aligned to `align` (a power of two): nothing is
/// committed and any access faults. `None` if the kernel has no room.
pub fn reserve(size: usize, align: usize) -> Option<usize> {
    // Over-reserve, then trim the ends, since mmap only promises page alignment.
    let padded = size.checked_add(align)?;
    // SAFETY: an anonymous inaccessible mapping at an address of the kernel's choosing touches
    // no existing memory; the result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            padded,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let start = p as usize;
    let base = start.next_multiple_of(align);
    let head = base - start;
    let tail = padded - head - size;
    // SAFETY: both pieces lie inside the mapping just made and are not part of the result.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((base + size) as *mut c_void, tail);
        }
    }
    Some(base)
}

/// Gives reserved address space back to the kernel.
///
/// # Safety
/// `[base, base + size)` must be a reservation made by [`reserve`] with nothing else using it.
pub unsafe fn unreserve(base: usize, size: usize) {
    // SAFETY: by the caller's contract the range is ours and unused.
    unsafe { libc::munmap(base as *mut c_void, size) };
}

/// Makes `size` bytes of physical memory: a memfd, committed only when touched.
pub fn create(size: usize) -> Option<OwnedFd> {
    // SAFETY: a NUL-terminated name and a valid flag; the result is checked.
    let fd = unsafe { libc::memfd_create(c"cudasim-vmm".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(size).ok()?;
    // SAFETY: `fd` is an open memfd; ftruncate only sets its size.
    let sized = unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), len) };
    (sized == 0).then_some(fd)
}

/// Maps `fd`'s first `size` bytes over `[base, base + size)`, shared, with `prot`.
///
/// # Safety
/// The range must lie inside a reservation of ours, with no other mapping of ours in it.
pub unsafe fn map(base: usize, size: usize, fd: &OwnedFd, prot: Prot) -> bool {
    // SAFETY: MAP_FIXED replaces only the caller's reserved, unused range.
    let p = unsafe {
        libc::mmap(
            base as *mut c_void,
            size,
            prot.bits(),
            libc::MAP_SHARED | libc::MAP_FIXED,
            std::os::fd::AsRawFd::as_raw_fd(fd),
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// Maps `fd` over `[base, base + size)` again, private, with `prot`: writes through it stay
/// in this process (a forked child's). Pages it has not written still show the file, and so
/// what the parent stores there later. Not charged against the machine's memory
/// (`MAP_NORESERVE`), as a private writable mapping otherwise is in full: one larger than
/// memory and swap would be refused and stay shared.
///
/// # Safety
/// The range must be a mapping of `fd` made by [`map`].
pub unsafe fn privatize(base: usize, size: usize, fd: &OwnedFd, prot: Prot) -> bool {
    // SAFETY: MAP_FIXED replaces only the caller's mapping of the same file, atomically.
    let p = unsafe {
        libc::mmap(
            base as *mut c_void,
            size,
            prot.bits(),
            libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
            std::os::fd::AsRawFd::as_raw_fd(fd),
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// Replaces `[base, base + size)` by reserved, inaccessible space again, so a later access
/// faults as it would on a GPU.
///
/// # Safety
/// The range must be a mapping made by [`map`], that nothing will read or write again.
pub unsafe fn unmap(base: usize, size: usize) {
    // SAFETY: MAP_FIXED replaces only the caller's mapping, atomically.
    unsafe {
        libc::mmap(
            base as *mut c_void,
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
}

/// Changes what the host may do through a mapping.
///
/// # Safety
/// The range must be a mapping made by [`map`].
pub unsafe fn protect(base: usize, size: usize, prot: Prot) {
    // SAFETY: by the caller's contract the range is one of our mappings.
    unsafe { libc::mprotect(base as *mut c_void, size, prot.bits()) };
}
