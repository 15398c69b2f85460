//! Exported entry points that know who called them: the return address on entry, an address
//! inside the calling object, is passed on as the allocation's `Origin`, which the reports
//! resolve to a library (`libtorch_cuda.so`, `libcublasLt.so`, the program).

/// Defines the exported `$name`, which calls `$imp` with its own arguments and then the
/// caller's return address. On x86-64 Linux the entry point is two instructions: the return
/// address, at `[rsp]` on entry, goes into the next argument register `$reg`, and a jump to
/// `$imp`, whose return goes straight back to the caller. Elsewhere the origin is 0 (not known).
macro_rules! exported_with_origin {
    (
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $imp:ident, $reg:literal
    ) => {
        $(#[$meta])*
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            core::arch::naked_asm!(
                concat!("mov ", $reg, ", qword ptr [rsp]"),
                "jmp {imp}",
                imp = sym $imp,
            )
        }

        $(#[$meta])*
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller's contract, passed on; no origin is known here.
            unsafe { $imp($($arg,)* 0) }
        }
    };
}

pub(crate) use exported_with_origin;
