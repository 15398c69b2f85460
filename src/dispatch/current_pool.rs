//! Whether each device's current memory pool is its default one. A program that made its own
//! pool current (`cudaDeviceSetMemPool`, `cuDeviceSetMemPool`) chose that pool's semantics:
//! its attributes, IPC export, its own figures. Its stream-ordered allocations then go to CUDA
//! untouched; only those from the default pool are the pool's (`mempool::malloc_async`,
//! `driver::mem_alloc`).
//!
//! One flag per device, shared by the runtime's and the driver's paths (CUDA has one current
//! pool per device for both). The allocation path reads it with one relaxed load. The hooks
//! of the set and destroy calls write it; a device not known yet (its first stream-ordered
//! allocation, or the first after a reset or a destroy) asks CUDA once. That also catches a
//! pool made current where no hook saw it: before the library was loaded, or through a path
//! it does not interpose.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::pool::MAX_DEVICES;

const UNKNOWN: u8 = 0;
const DEFAULT: u8 = 1;
const OWN: u8 = 2;

static CURRENT: [AtomicU8; MAX_DEVICES] = [const { AtomicU8::new(UNKNOWN) }; MAX_DEVICES];

/// Whether device `dev`'s current pool is its default one. While that is not known, `ask`
/// says (`None`: CUDA could not say, taken as the default pool: its allocations stay pooled,
/// as before the question existed), once.
#[inline(always)]
pub(crate) fn is_default(dev: u32, ask: impl FnOnce() -> Option<bool>) -> bool {
    let Some(slot) = CURRENT.get(dev as usize) else {
        return false;
    };
    match slot.load(Ordering::Relaxed) {
        DEFAULT => true,
        OWN => false,
        _ => learn(slot, ask),
    }
}

/// Records what `ask` says, unless a set or destroy recorded an answer meanwhile (theirs is
/// newer than the question).
#[cold]
fn learn(slot: &AtomicU8, ask: impl FnOnce() -> Option<bool>) -> bool {
    let answer = if ask().unwrap_or(true) { DEFAULT } else { OWN };
    match slot.compare_exchange(UNKNOWN, answer, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => answer == DEFAULT,
        Err(recorded) => recorded == DEFAULT,
    }
}

/// After a successful set of device `device`'s current pool: whether the pool set is the
/// device's default one (`None`: CUDA could not say; the pool set is then taken as the
/// program's own, whose allocations CUDA serves right in any case).
pub(crate) fn note_set(device: i32, is_default: Option<bool>) {
    let Some(slot) = usize::try_from(device).ok().and_then(|d| CURRENT.get(d)) else {
        return;
    };
    let state = if is_default == Some(true) {
        DEFAULT
    } else {
        OWN
    };
    slot.store(state, Ordering::Relaxed);
}

/// After a successful destroy of a pool: the device it was current on (if any) has its
/// default pool current again. Which device that was is asked again at each device's next
/// allocation.
pub(crate) fn note_destroyed() {
    for slot in &CURRENT {
        let _ = slot.compare_exchange(OWN, UNKNOWN, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Device `dev` was reset: what is current there is asked again.
pub(crate) fn forget(dev: u32) {
    if let Some(slot) = CURRENT.get(dev as usize) {
        slot.store(UNKNOWN, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the flags are the process's, and a destroy touches every device.
    #[test]
    fn asks_once_and_follows_sets_destroys_and_resets() {
        let mut asked = 0;
        assert!(is_default(10, || {
            asked += 1;
            Some(true)
        }));
        assert!(is_default(10, || unreachable!("asked again")));
        assert_eq!(asked, 1);
        note_set(10, Some(false));
        assert!(!is_default(10, || unreachable!()));
        note_set(10, Some(true));
        assert!(is_default(10, || unreachable!()));
        note_set(10, None);
        assert!(
            !is_default(10, || unreachable!()),
            "unknown: the program's own"
        );
        note_destroyed();
        assert!(
            !is_default(10, || Some(false)),
            "asked again after a destroy"
        );
        forget(10);
        assert!(is_default(10, || None), "a failed question keeps pooling");
        assert!(is_default(10, || unreachable!()));

        // A set made while the question was asked wins.
        assert!(!is_default(11, || {
            note_set(11, Some(false));
            Some(true)
        }));
        assert!(!is_default(11, || unreachable!()));

        // Devices outside the pool's range: not pooled, nothing recorded.
        assert!(!is_default(MAX_DEVICES as u32, || Some(true)));
        note_set(-1, Some(false));
        note_set(MAX_DEVICES as i32, Some(false));
        forget(MAX_DEVICES as u32);
    }
}
