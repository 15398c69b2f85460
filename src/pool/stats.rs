//! Counters each device pool keeps under its own lock. The summary is built from these alone:
//! nothing is asked of CUDA at exit.

/// Updates of counters that only reports read, on the allocation hit path. The `stats` feature
/// (on by default) keeps them; `--no-default-features` compiles them out, which is how
/// `scripts/bench.sh` measures what they cost. The algorithm's own figures (allocated and
/// reserved bytes) are always kept.
macro_rules! counted {
    ($($t:tt)*) => {
        #[cfg(feature = "stats")]
        {
            $($t)*
        }
    };
}
pub(crate) use counted;

/// A quantity with a current value, its peak, and what went in and out over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauge {
    pub current: u64,
    /// The peak since the last `reset_peak` (the run's start if none).
    pub peak: u64,
    /// The highest peak before the last `reset_peak`.
    pub earlier_peak: u64,
    pub total_in: u64,
    pub total_out: u64,
}

impl Gauge {
    /// The peak over the whole run, whatever was reset: what the summary reports.
    pub fn peak_ever(&self) -> u64 {
        self.peak.max(self.earlier_peak)
    }
    /// Start a new peak from the current value (a program's reset of its peak statistics,
    /// `cudaMemPoolSetAttribute` of a high-water mark); the run's peak is kept.
    pub fn reset_peak(&mut self) {
        self.earlier_peak = self.peak_ever();
        self.peak = self.current;
    }
    /// The peak is written only when it moves: a comparison and a branch on the hit path.
    #[inline(always)]
    pub fn add(&mut self, n: u64) {
        self.current += n;
        // Wrapping: the requests of a corrupt replayed trace may add up past `u64::MAX` (no live
        // run's do), and a saturating add costs the hit path instructions. `current` cannot,
        // being at most what the driver gave.
        self.total_in = self.total_in.wrapping_add(n);
        if self.current > self.peak {
            self.peak = self.current;
        }
    }
    pub fn sub(&mut self, n: u64) {
        self.current -= n;
        self.total_out = self.total_out.wrapping_add(n);
    }
    /// Held by a thread cache: counted now, but not as the program's own traffic (the thread
    /// cache counts that).
    pub fn lend(&mut self, n: u64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
    }
    pub fn unlend(&mut self, n: u64) {
        self.current -= n;
    }
}

/// Buckets of the request-size histogram: bucket `i` holds requests in `[2^(i-1), 2^i)`, bucket
/// 0 holds size 0.
pub const HISTOGRAM_BUCKETS: usize = 48;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceStats {
    /// Bytes the program asked for.
    pub requested: Gauge,
    /// Bytes handed out after rounding.
    pub allocated: Gauge,
    /// Bytes held from the driver.
    pub reserved: Gauge,
    /// Live blocks.
    pub blocks: Gauge,
    /// Segments held from the driver.
    pub segments: Gauge,
    pub allocs: u64,
    pub frees: u64,
    /// Allocations served from cached memory.
    pub hits: u64,
    /// Allocations that needed a new segment from the driver.
    pub misses: u64,
    /// Allocations served by a thread's own cache, without the device's lock (part of `hits`).
    pub thread_cache_hits: u64,
    /// Allocations on a stream served by a block freed on that stream and not yet covered by a
    /// barrier or fence (stream-ordered reuse, part of `hits`).
    pub stream_hits: u64,
    /// Blocks thread caches borrowed from the device or gave back to it.
    pub thread_cache_borrowed: u64,
    pub thread_cache_returned: u64,
    /// Real `cudaMalloc` / `cudaFree` calls made.
    pub real_mallocs: u64,
    pub real_frees: u64,
    /// Of `real_mallocs`, those the driver refused (no segment made).
    pub real_mallocs_refused: u64,
    /// Time spent in them.
    pub real_malloc_ns: u64,
    pub real_free_ns: u64,
    /// Segments (and bytes) released because the release threshold was exceeded.
    pub threshold_releases: u64,
    pub threshold_released_bytes: u64,
    /// Segments (and bytes) released by an explicit empty-cache request.
    pub empty_cache_releases: u64,
    pub empty_cache_released_bytes: u64,
    /// Of the releases by threshold and by empty-cache request, with expandable segments: the
    /// granules unmapped. Their bytes count among the released bytes, the granules not among
    /// the segments (a range stays reserved).
    pub threshold_released_granules: u64,
    pub empty_cache_released_granules: u64,
    /// Idle segments (and bytes) released because a larger request outgrew them.
    pub outgrown_releases: u64,
    pub outgrown_released_bytes: u64,
    /// Real `cudaMalloc` failures the pool recovered from by releasing cache, and those it could
    /// not (returned to the program as out-of-memory).
    pub oom_retries: u64,
    pub oom_recovered: u64,
    pub ooms: u64,
    /// Of `ooms`, requests of all the free memory the program was told of: probes, whose
    /// refusal the program expected (no out-of-memory report was printed).
    pub oom_probes: u64,
    /// Bytes released to make room when the driver said out-of-memory.
    pub oom_released_bytes: u64,
    /// Segments the pool's limit (`GPUPOOL_LIMIT`) refused before asking the driver.
    pub limit_refusals: u64,
    /// Device fences the pool took itself, and the time they blocked the host.
    pub fences: u64,
    pub fence_ns: u64,
    /// Fences the program took (`cudaDeviceSynchronize`) that made pending blocks reusable.
    pub observed_fences: u64,
    /// Legacy-stream barriers the pool issued.
    pub barriers: u64,
    /// Frees of pointers inside pool memory that were not live blocks (double or interior).
    pub invalid_frees: u64,
    /// `cudaDeviceReset` calls that made the pool forget this device.
    pub resets: u64,
    /// Granules of expandable segments mapped and unmapped over the run, and reservations of
    /// a range the driver refused (the request got a classic segment).
    pub granules_mapped: u64,
    pub granules_unmapped: u64,
    /// Of those, granules unmapped to keep the pool within its mapped slack, and the times a
    /// request made the pool do so.
    pub slack_unmapped_granules: u64,
    pub slack_moves: u64,
    pub ranges_refused: u64,
    pub histogram: [u64; HISTOGRAM_BUCKETS],
}

impl Default for DeviceStats {
    fn default() -> Self {
        DeviceStats {
            requested: Gauge::default(),
            allocated: Gauge::default(),
            reserved: Gauge::default(),
            blocks: Gauge::default(),
            segments: Gauge::default(),
            allocs: 0,
            frees: 0,
            hits: 0,
            misses: 0,
            thread_cache_hits: 0,
            stream_hits: 0,
            thread_cache_borrowed: 0,
            thread_cache_returned: 0,
            real_mallocs: 0,
            real_frees: 0,
            real_mallocs_refused: 0,
            real_malloc_ns: 0,
            real_free_ns: 0,
            threshold_releases: 0,
            threshold_released_bytes: 0,
            empty_cache_releases: 0,
            empty_cache_released_bytes: 0,
            threshold_released_granules: 0,
            empty_cache_released_granules: 0,
            outgrown_releases: 0,
            outgrown_released_bytes: 0,
            oom_retries: 0,
            oom_recovered: 0,
            ooms: 0,
            oom_probes: 0,
            oom_released_bytes: 0,
            limit_refusals: 0,
            fences: 0,
            fence_ns: 0,
            observed_fences: 0,
            barriers: 0,
            invalid_frees: 0,
            resets: 0,
            granules_mapped: 0,
            granules_unmapped: 0,
            slack_unmapped_granules: 0,
            slack_moves: 0,
            ranges_refused: 0,
            histogram: [0; HISTOGRAM_BUCKETS],
        }
    }
}

impl DeviceStats {
    /// Real `cudaMalloc` calls the driver refused: counted among the calls, no segment made.
    /// Counted as they happen: segments made do not tell, since a range of expandable segments
    /// is one without a `cudaMalloc`.
    pub fn mallocs_refused(&self) -> u64 {
        self.real_mallocs_refused
    }

    /// Allocations served without a new segment, each a `cudaMalloc` the program would have
    /// made without the pool.
    pub fn mallocs_avoided(&self) -> u64 {
        self.allocs.saturating_sub(self.misses)
    }
}

pub fn histogram_bucket(size: u64) -> usize {
    ((64 - size.leading_zeros()) as usize).min(HISTOGRAM_BUCKETS - 1)
}
