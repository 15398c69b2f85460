//! A mapping the driver refused for lack of memory: the last step of the ladder for ranges
//! (docs/design-notes.md, "Note: expandable segments").
//!
//! The steps are those of classic segments (`grow.rs`, `recover_from_oom`): the blocks thread
//! caches hold come back, a fence makes pending blocks free, and a block of them that fits,
//! mapped already, serves; only then does the cache go back and the request map again. A
//! device its program keeps full runs out of memory at each request until such a fence, and
//! giving the cache back first made it unmap and map that cache again every time.

use super::*;
use crate::pool::trace::SEGMENT_BEYOND_MEMORY;

impl DevicePool {
    /// Mapping failed for lack of memory: take back what thread caches hold and fence so that
    /// pending blocks become reusable, and serve from them if one fits, mapped already; else
    /// give back free granules and idle classic segments, and fit and map again.
    pub(super) fn recover_mapping(
        &mut self,
        rounded: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Result<u32, CudaError> {
        self.stats.oom_retries += 1;
        let class = class_of(rounded);
        let (fit, fenced, capture) =
            self.fit_after_reclaim_and_fence(class, rounded, backend, clock, policy);
        if let Some(idx) = fit.filter(|&idx| self.ready_to_serve(idx, rounded, backend, policy)) {
            self.stats.oom_recovered += 1;
            return Ok(idx);
        }
        let released = self.release_segments(backend, clock, 0, Release::OutOfMemory);
        self.limit_refused = false;
        let mut fit = self.fit_after_return(class, rounded, policy);
        if fit.is_none() {
            fit = self.cheapest_room(class, rounded, policy);
        }
        if fit.is_none() {
            fit = self
                .grow(class, rounded, &[rounded], backend, policy)
                .and_then(Result::ok);
        }
        if let Some(idx) = fit.filter(|&idx| self.ready_to_serve(idx, rounded, backend, policy)) {
            self.stats.oom_recovered += 1;
            return Ok(idx);
        }
        // Granules are whole: the last part of a limit or of the device's free memory that is
        // no multiple of one takes no granule, yet a segment of the request's own size fits
        // there, as it would without the pool.
        let asked_before = self.stats.real_mallocs;
        if self.limit_refused || self.device_may_hold(rounded, backend) {
            // That segment's answer says who refused: the limit (which marks it again), or the
            // driver, which then lacks the request's own size whatever the limit.
            self.limit_refused = false;
            if let Ok(idx) = self.new_classic_segment(class, rounded, backend) {
                self.stats.misses += 1;
                self.stats.oom_recovered += 1;
                return Ok(idx);
            }
        }
        self.stats.ooms += 1;
        self.sample_memory(backend);
        self.last_oom = Some(OomEvent {
            requested: rounded,
            segment: rounded.next_multiple_of(self.granule),
            released,
            fenced,
            capture,
            mapping: true,
            segment_asked: self.stats.real_mallocs > asked_before,
            limited: self.limit_refused,
            memory: self.memory,
        });
        Err(CudaError::MEMORY_ALLOCATION)
    }

    /// Whether block `idx` serves `rounded` bytes once what it lacks is mapped. A block that
    /// fits without mapping may still lie over a granule a refused mapping left unready:
    /// `map_block` maps it afresh, as on every other path. One that cannot serve joins its
    /// free neighbour again.
    fn ready_to_serve(
        &mut self,
        idx: u32,
        rounded: u64,
        backend: &dyn Backend,
        policy: &Policy,
    ) -> bool {
        if !self.seg(self.blocks[idx as usize].seg).expandable
            || self.map_block(idx, rounded, backend, policy).is_ok()
        {
            return true;
        }
        self.rejoin(idx);
        false
    }

    /// Whether the device may have `bytes` free for a segment: asked now, and where it cannot
    /// say, it may. Less free is the driver's refusal, recorded as made, since a replay cannot
    /// know the free memory and asks.
    fn device_may_hold(&mut self, bytes: u64, backend: &dyn Backend) -> bool {
        match self.sample_memory(backend) {
            Some(m) if m.free < bytes => {
                let code = CudaError::MEMORY_ALLOCATION.0 as u64;
                self.record(Kind::SegmentRefused, bytes, code, 0, SEGMENT_BEYOND_MEMORY);
                false
            }
            _ => true,
        }
    }
}
