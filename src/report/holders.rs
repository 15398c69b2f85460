//! Who holds the memory: the blocks still allocated, grouped by the object that made each
//! allocation (its `Origin`, resolved only now), for the summary, the live dump and the
//! out-of-memory report.

use std::hash::BuildHasherDefault;

use super::units::{bytes, count};
use crate::pool::{IntHasher, LiveBlock};

/// A library that holds live blocks: its name in the reports, its blocks and their requested
/// bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub library: String,
    pub blocks: u64,
    pub bytes: u64,
}

/// The library each live block's `Origin` lies in, resolved now (an object unloaded since is
/// named by `unloaded`), with their blocks and bytes, most bytes first.
pub fn holders(live: &[LiveBlock]) -> Vec<Holder> {
    // Not SipHash, whose keys come from `getrandom`: a cancellation point (`pool::cancel`).
    let mut by_origin: std::collections::HashMap<u64, (u64, u64), BuildHasherDefault<IntHasher>> =
        Default::default();
    for b in live {
        let e = by_origin.entry(b.origin).or_default();
        e.0 += 1;
        e.1 += b.requested;
    }
    let mut by_maker: Vec<(Maker, u64, u64)> = Vec::new();
    for (origin, (blocks, bytes)) in by_origin {
        let maker = maker_of(origin);
        match by_maker.iter_mut().find(|(m, ..)| *m == maker) {
            Some((_, b, n)) => {
                *b += blocks;
                *n += bytes;
            }
            None => by_maker.push((maker, blocks, bytes)),
        }
    }
    // Two objects of one file name (copies in two directories) are told apart by their paths.
    let shared = |m: &Maker| {
        by_maker
            .iter()
            .any(|(o, ..)| o.file_name().is_some() && o.file_name() == m.file_name() && o != m)
    };
    let mut by_library: Vec<Holder> = by_maker
        .iter()
        .map(|(m, blocks, bytes)| Holder {
            library: m.name(shared(m)),
            blocks: *blocks,
            bytes: *bytes,
        })
        .collect();
    by_library.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.library.cmp(&b.library)));
    by_library
}

/// Who made an allocation, as far as its `Origin` tells.
#[derive(PartialEq, Eq)]
enum Maker {
    /// The C API or PyTorch's pluggable allocator (origin 0).
    Api,
    /// An address in no loaded object: code made at run time.
    Unknown,
    /// The main program, by its file name.
    Program(String),
    /// A shared library, by the dynamic linker's path for it.
    Library { path: String, unloaded: bool },
}

impl Maker {
    /// A library's file name, the part of its path the reports show.
    fn file_name(&self) -> Option<&str> {
        match self {
            Maker::Library { path, .. } => path.rsplit('/').next(),
            _ => None,
        }
    }

    /// The reports' name: a library by its file name, or by its whole path when `by_path`.
    fn name(&self, by_path: bool) -> String {
        match self {
            Maker::Api => "gpupool_* calls".into(),
            Maker::Unknown => "unknown".into(),
            Maker::Program(exe) => format!("the program ({exe})"),
            Maker::Library { path, unloaded } => {
                let shown = match by_path {
                    true => path.as_str(),
                    false => self.file_name().unwrap_or(path),
                };
                match unloaded {
                    true => format!("{shown} (unloaded)"),
                    false => shown.to_string(),
                }
            }
        }
    }
}

/// The object `origin` lies in; the main program by the program's own name.
/// The dynamic linker's own name for the object, not `dladdr`'s: `dladdr` names the main
/// program by its `argv[0]`, which a shell that searched `PATH` passes bare and a launcher
/// may set to anything.
fn maker_of(origin: u64) -> Maker {
    if origin == 0 {
        return Maker::Api;
    }
    if let Some(path) = super::unloaded::path_of(origin) {
        return Maker::Library {
            path,
            unloaded: true,
        };
    }
    let Some((_, path)) = crate::cuda::dl::linked_object_of(origin as usize) else {
        return Maker::Unknown;
    };
    // SAFETY: a NUL-terminated path owned by the dynamic linker, read at once.
    let path = unsafe { std::ffi::CStr::from_ptr(path) }
        .to_string_lossy()
        .into_owned();
    let program = std::env::current_exe().ok();
    let is_program = path.is_empty()
        || program.as_deref().is_some_and(|p| {
            p.as_os_str() == std::ffi::OsStr::new(&path)
                || std::fs::canonicalize(&path).is_ok_and(|c| c == p)
        });
    if !is_program {
        return Maker::Library {
            path,
            unloaded: false,
        };
    }
    let exe = program
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    Maker::Program(exe.unwrap_or_else(|| path.rsplit('/').next().unwrap_or(&path).to_string()))
}

/// `libc10_cuda.so 3.00 MiB in 3 blocks, the program (train) 1.00 MiB in 1 block`.
pub fn holders_text(holders: &[Holder]) -> String {
    holders
        .iter()
        .map(|h| {
            format!(
                "{} {} in {}",
                h.library,
                bytes(h.bytes),
                count(h.blocks, "block")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
