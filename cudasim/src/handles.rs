//! Opaque handles (`cudaStream_t`, `cudaEvent_t`, `cudaMemPool_t`, `cudaGraph_t`, `CUcontext`,
//! `CUgreenCtx`, `CUdevResourceDesc`): heap objects with a magic field. The registries in the
//! state are keyed by their addresses, so a handle is looked up before it is ever dereferenced: an
//! invalid one gives `cudaErrorInvalidResourceHandle`, not a crash.

pub const STREAM_MAGIC: u64 = 0x5354_5245_414d_4353; // "SCMAERTS"
pub const EVENT_MAGIC: u64 = 0x4556_454e_5453_4943; // "CISTNEVE"
pub const POOL_MAGIC: u64 = 0x4d45_4d50_4f4f_4c53; // "SLOOPMEM"
pub const GRAPH_MAGIC: u64 = 0x4752_4150_4853_494d; // "MISHPARG"
pub const CONTEXT_MAGIC: u64 = 0x434f_4e54_4558_5453; // "STXETNOC"
pub const GREEN_MAGIC: u64 = 0x4752_4545_4e43_5458; // "XTCNEERG"
pub const RESOURCE_DESC_MAGIC: u64 = 0x5245_5344_4553_4352; // "RCSEDSER"

/// What a handle points to.
#[repr(C)]
pub struct Handle {
    magic: u64,
}

/// Allocates a handle; returns its address.
pub fn create(magic: u64) -> usize {
    Box::into_raw(Box::new(Handle { magic })) as usize
}

/// Checks the magic of a handle found in a registry.
///
/// # Safety
/// `addr` must come from `create` and not have been passed to `destroy`.
pub unsafe fn has_magic(addr: usize, magic: u64) -> bool {
    // SAFETY: by the caller's contract `addr` is a live `Handle` made by `create`.
    unsafe { (*(addr as *const Handle)).magic == magic }
}

/// Frees a handle (its magic is cleared first).
///
/// # Safety
/// `addr` must come from `create` and not have been passed to `destroy` before; it must be
/// removed from its registry so that it is never dereferenced again.
pub unsafe fn destroy(addr: usize) {
    // SAFETY: by the caller's contract `addr` is a live `Handle` made by `Box::into_raw`.
    let mut handle = unsafe { Box::from_raw(addr as *mut Handle) };
    handle.magic = 0;
    drop(handle);
}
