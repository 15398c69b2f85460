//! Size classes: how a request is rounded, which segment size serves it, and when a cached
//! block may be split.
//!
//! The rules start from PyTorch's documented ones, so users meet familiar numbers: 512-byte
//! rounding; requests up to 1 MiB share "small" segments; 1–10 MiB requests get 20 MiB
//! segments; larger requests get a segment of their own rounded to 2 MiB. Small blocks split
//! freely; a large block is split only when the remainder exceeds 1 MiB, so big blocks are not
//! shredded into slivers. `max_split_size` keeps big blocks of classic segments whole; an
//! expandable segment's blocks are address space and split whatever it says.
//!
//! These are classic segments. With expandable segments (the default) every block comes from a
//! reserved range instead, small ones from a range of their own (`device/expandable.rs`): the
//! small segment's size then only says when a request is small.
//!
//! Small segments are 4 MiB, not PyTorch's 2: half the `cudaMalloc` calls for small requests
//! (the generated inference trace: 42 calls instead of 62; random requests up to 1 MiB: half),
//! with the same peak reserved memory or less on every workload of `gpupool-trace compare`, since
//! a small pool's fragments are what it reserves beyond its peak either way.
//!
//! One rule of our own: the first request above `GROW_FROM` a device sees gets a segment rounded
//! up to the next `2^k` or `1.5 × 2^k`. Programs whose biggest tensors grow (a model's fp32
//! logits after its bf16 ones, an inference server's logits as prompts get longer) then reuse
//! that headroom; the remainder is an ordinary free block meanwhile. Later large requests get
//! the plain 2 MiB rounding: by then the device replaces idle segments a larger request
//! outgrew (`DevicePool::release_outgrown`), and room in every segment would only raise the
//! peak.

/// Every block is a multiple of this, and so 512-byte aligned (the runtime guarantees 256).
pub const ALIGN: u64 = 512;
/// Requests up to this size are "small": small segments, or a range of their own.
pub const SMALL_LIMIT: u64 = 1 << 20;
pub const SMALL_SEGMENT: u64 = 4 << 20;
/// Requests above `SMALL_LIMIT` and up to this size share medium segments.
pub const MEDIUM_LIMIT: u64 = 10 << 20;
/// Blocks up to this size (after rounding) go through thread caches: small and medium ones, whose
/// segments are 4 and 20 MiB, so a cache pins little.
pub const THREAD_CACHED_LIMIT: u64 = MEDIUM_LIMIT;
pub const MEDIUM_SEGMENT: u64 = 20 << 20;
/// Larger requests get a segment of their own, rounded up to this.
pub const LARGE_ROUND: u64 = 2 << 20;
/// A record-setting request above this gets a segment rounded up to a half power of two.
pub const GROW_FROM: u64 = 512 << 20;
/// Such a request first releases the idle large segments of at least this size it outgrew
/// (`DevicePool::release_outgrown`).
pub const OUTGROWN_FROM: u64 = 256 << 20;
/// A large block is split only when what remains is larger than this.
pub const LARGE_SPLIT_REMAINDER: u64 = 1 << 20;
/// A cached block at least `max_split_size` large serves a request of at least that size only if
/// it wastes less than this.
pub const OVERSIZE_SLACK: u64 = 20 << 20;

/// The two pools of a device: small blocks never mix with large ones, which keeps long-lived
/// small tensors from pinning large segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Small,
    Large,
}

/// The bytes of a limit (`GPUPOOL_LIMIT`) the pool can reserve: segments are whole multiples of
/// `ALIGN`, so what a limit holds past its last multiple never serves a request, and
/// `cudaMemGetInfo` must not count it as free. `u64::MAX`, no limit, stays.
pub fn usable_limit(limit: u64) -> u64 {
    match limit {
        u64::MAX => limit,
        l => l & !(ALIGN - 1),
    }
}

/// The block size for a request, or `None` when rounding would overflow.
pub fn round_request(size: u64) -> Option<u64> {
    let n = size.max(1);
    n.checked_add(ALIGN - 1).map(|v| v & !(ALIGN - 1))
}

pub fn class_of(rounded: u64) -> Class {
    if rounded <= SMALL_LIMIT {
        Class::Small
    } else {
        Class::Large
    }
}

/// The largest request a free block of `class` and `size` bytes serves: a small block serves
/// small requests only (a larger one is large and fits in the large pool), so at most
/// `SMALL_LIMIT` of it counts. What the reports' "largest free block" means.
pub fn served_by(class: Class, size: u64) -> u64 {
    match class {
        Class::Small => size.min(SMALL_LIMIT),
        Class::Large => size,
    }
}

/// The size of the segment to ask the driver for when no cached block fits; `largest` is the
/// largest large segment the device has allocated so far (`u64::MAX`: never round up).
pub fn segment_size(rounded: u64, largest: u64) -> Option<u64> {
    if rounded <= SMALL_LIMIT {
        Some(SMALL_SEGMENT)
    } else if rounded <= MEDIUM_LIMIT {
        Some(MEDIUM_SEGMENT)
    } else {
        let exact = round_up(rounded, LARGE_ROUND)?;
        if rounded <= GROW_FROM || largest > GROW_FROM {
            return Some(exact);
        }
        // Half the power of two at or below the request: the step between 2^k, 1.5 × 2^k and
        // 2^(k+1).
        let step = 1u64 << (63 - rounded.leading_zeros() - 1);
        Some(round_up(rounded, step).unwrap_or(exact))
    }
}

/// `n` rounded up to a multiple of `step`, a power of two.
fn round_up(n: u64, step: u64) -> Option<u64> {
    n.checked_add(step - 1).map(|v| v & !(step - 1))
}

/// Whether a cached block of `block` bytes may serve a request of `rounded` bytes, with
/// `max_split_size` the block's split cap (`u64::MAX` for none; an expandable segment's blocks
/// have none: `DevicePool::split_cap`).
pub fn may_serve(block: u64, rounded: u64, max_split_size: u64) -> bool {
    if block < rounded {
        return false;
    }
    if rounded < max_split_size {
        // Blocks kept whole by max_split_size only serve requests at least as large, except the
        // request's own 2 MiB rounding: a request just under the cap gets a segment at or above
        // it, which must serve that size again: else each cycle of a 127.5 MiB request under a
        // 128 MiB cap takes a new segment until the driver runs out, as PyTorch's rule does.
        block < max_split_size || block - rounded < LARGE_ROUND
    } else {
        block - rounded < OVERSIZE_SLACK
    }
}

/// Whether serving `rounded` from a cached block of `block` bytes splits off the remainder,
/// with `max_split_size` the block's split cap, as for `may_serve`.
pub fn should_split(class: Class, block: u64, rounded: u64, max_split_size: u64) -> bool {
    let rest = block - rounded;
    match class {
        Class::Small => rest >= ALIGN,
        Class::Large => rest > LARGE_SPLIT_REMAINDER && block < max_split_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_bound_of_the_configuration_is_the_medium_segment() {
        assert_eq!(crate::config::MAX_SPLIT_SIZE_ABOVE, MEDIUM_SEGMENT);
    }

    #[test]
    fn rounding() {
        assert_eq!(round_request(1), Some(512));
        assert_eq!(round_request(0), Some(512));
        assert_eq!(round_request(512), Some(512));
        assert_eq!(round_request(513), Some(1024));
        assert_eq!(round_request(u64::MAX), None);
        assert_eq!(round_request(u64::MAX - 510), None);
        assert_eq!(round_request(u64::MAX - 1024), Some(u64::MAX - 1023));
    }

    #[test]
    fn segment_sizes() {
        assert_eq!(segment_size(512, 0), Some(SMALL_SEGMENT));
        assert_eq!(segment_size(1 << 20, 0), Some(SMALL_SEGMENT));
        assert_eq!(segment_size((1 << 20) + 512, 0), Some(MEDIUM_SEGMENT));
        assert_eq!(segment_size(10 << 20, 0), Some(MEDIUM_SEGMENT));
        assert_eq!(segment_size((10 << 20) + 512, 0), Some(12 << 20));
        assert_eq!(segment_size(GROW_FROM, 0), Some(GROW_FROM));
        assert_eq!(segment_size(u64::MAX - 511, 0), None);
        assert_eq!(
            segment_size(u64::MAX - (1 << 30), 0),
            Some(u64::MAX - (1 << 30) + 1)
        );
        // The first request above GROW_FROM: the next 2^k or 1.5 × 2^k.
        assert_eq!(segment_size(GROW_FROM + 512, 0), Some(768 << 20));
        assert_eq!(segment_size(785 << 20, 300 << 20), Some(1 << 30));
        assert_eq!(segment_size(1064 << 20, GROW_FROM), Some(1536 << 20));
        assert_eq!(segment_size(3 << 30, 0), Some(3 << 30));
        // Once the device has had a segment above GROW_FROM: 2 MiB rounding, larger or not.
        assert_eq!(segment_size(1001 << 20, 768 << 20), Some(1002 << 20));
        assert_eq!(segment_size(1570 << 20, 2 << 30), Some(1570 << 20));
        assert_eq!(
            segment_size((1570 << 20) + 512, 1572 << 20),
            Some(1572 << 20)
        );
        assert_eq!(
            segment_size(GROW_FROM + 512, u64::MAX),
            Some(GROW_FROM + (2 << 20))
        );
        assert_eq!(class_of(1 << 20), Class::Small);
        assert_eq!(class_of((1 << 20) + 512), Class::Large);
    }

    #[test]
    fn split_bounds() {
        // Small blocks split down to the last 512 bytes.
        assert!(should_split(
            Class::Small,
            2 << 20,
            (2 << 20) - 512,
            u64::MAX
        ));
        assert!(!should_split(Class::Small, 1024, 1024, u64::MAX));
        // Large blocks keep a remainder of up to 1 MiB rather than leave a sliver.
        assert!(!should_split(Class::Large, 20 << 20, 19 << 20, u64::MAX));
        assert!(should_split(
            Class::Large,
            20 << 20,
            (19 << 20) - 512,
            u64::MAX
        ));
        // max_split_size keeps big blocks whole...
        assert!(!should_split(Class::Large, 64 << 20, 32 << 20, 64 << 20));
        // ...and away from smaller requests.
        assert!(!may_serve(64 << 20, 2 << 20, 64 << 20));
        assert!(!may_serve(64 << 20, 60 << 20, 64 << 20));
        assert!(may_serve(80 << 20, 70 << 20, 64 << 20));
        assert!(!may_serve(128 << 20, 64 << 20, 64 << 20));
        assert!(may_serve(4 << 20, 2 << 20, u64::MAX));
        assert!(!may_serve(1 << 20, 2 << 20, u64::MAX));
    }
}
