//! The reference model: what each reuse mode makes a freed block wait for, and each step run
//! against the pool and the model.

use super::*;

/// What a freed block waits for, as the README states the reuse modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    Nothing,
    Barrier,
    Fence,
}

pub(crate) fn wait_for(reuse: ReuseMode, kind: FreeKind, beyond_barriers: bool) -> Wait {
    match (reuse, kind) {
        (ReuseMode::Strict, _)
        | (_, FreeKind::Ordered { .. })
        | (
            _,
            FreeKind::Async {
                blocking: false, ..
            },
        ) => Wait::Fence,
        (ReuseMode::Barrier, _) | (ReuseMode::Relaxed, FreeKind::Async { .. })
            if beyond_barriers =>
        {
            Wait::Fence
        }
        (ReuseMode::Barrier, _) | (ReuseMode::Relaxed, FreeKind::Async { .. }) => Wait::Barrier,
        (ReuseMode::Relaxed, FreeKind::Sync) => Wait::Nothing,
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Dirty {
    pub(crate) dev: u32,
    pub(crate) addr: Addr,
    pub(crate) len: u64,
    pub(crate) freed_at: u64,
    pub(crate) wait: Wait,
    /// Freed on this stream: in `relaxed` mode, an allocation on the same stream may reuse it
    /// at once (stream order covers it).
    pub(crate) stream: Option<u64>,
    /// Freed by the program's own `cudaFreeAsync`: the same stream may reuse it at once in
    /// every mode.
    pub(crate) ordered: bool,
}

/// The reference model.
pub(crate) struct Reference {
    pub(crate) setup: Setup,
    /// Live blocks: base → (device, rounded, requested).
    pub(crate) live: BTreeMap<Addr, (u32, u64, u64)>,
    /// Freed ranges not yet covered by what their reuse waits for.
    pub(crate) dirty: Vec<Dirty>,
    /// Addresses freed and not handed out since (for double frees).
    pub(crate) freed: Vec<Addr>,
    pub(crate) beyond_barriers: bool,
    /// A barrier begun per device: (its sequence, the step it began).
    pub(crate) begun: [Option<(gpupool::pool::SyncSeq, u64)>; DEVICES as usize],
}

pub(crate) fn round(size: u64) -> Option<u64> {
    size.max(1).checked_add(511).map(|v| v & !511)
}

pub(crate) fn fail(msg: String) -> Result<(), String> {
    Err(msg)
}

/// What a step's release point must have given back (`check`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// An allocation: down to the threshold, but for the granules pending blocks keep.
    Threshold,
    /// A program synchronization: down to the threshold, the granules pending blocks kept too
    /// (the pool fences for them, as a classic segment's `cudaFree` waits).
    Synchronized,
    /// Empty-cache: everything free.
    All,
}

/// Runs one step against the pool and the model; returns the device whose release point must
/// hold afterwards, and what it gives back.
pub(crate) fn apply(
    pool: &Pool<Driver>,
    m: &mut Reference,
    op: &Op,
    clock: u64,
) -> Result<Option<(u32, Released)>, String> {
    let driver = pool.backend();
    let pick_live = |m: &Reference, pick: usize| -> Option<(Addr, u32, u64)> {
        let n = m.live.len();
        (n > 0).then(|| {
            let (&a, &(d, len, _)) = m.live.iter().nth(pick % n).expect("in range");
            (a, d, len)
        })
    };
    match *op {
        Op::Again { pick } => {
            let Some((addr, dev, _)) = pick_live(m, pick) else {
                return Ok(None);
            };
            let size = m.live[&addr].2;
            apply(pool, m, &Op::Free { pick, current: dev }, clock)?;
            driver.with(|s| s.clock = clock + 1);
            return apply(pool, m, &Op::Alloc { dev, size }, clock + 1);
        }
        Op::Alloc { dev, size } | Op::AllocOn { dev, size, .. } => {
            let on = match *op {
                Op::AllocOn { stream, .. } => Some(stream),
                _ => None,
            };
            let r = pool.alloc_on(dev, size, on);
            let delivered = driver.model.delivered();
            match r {
                Ok(addr) => {
                    let rounded = round(size).ok_or("a size that does not round was served")?;
                    // The block may be larger than the request when the rest is too small to
                    // split off (or `max_split_size` keeps it whole).
                    let (bdev, block) = pool.live_block(addr).ok_or("not a live block")?;
                    let len = block.size;
                    if bdev != dev || len < rounded || block.requested != size {
                        return Err(format!(
                            "{addr:#x}: block of {len} bytes on device {bdev} for {size} on {dev}"
                        ));
                    }
                    if addr % 512 != 0 {
                        return Err(format!("{addr:#x} is not 512-byte aligned"));
                    }
                    if let Some((&b, &(bd, blen, _))) = m.live.range(..addr + len).next_back() {
                        if b + blen > addr {
                            return Err(format!(
                                "{addr:#x}+{len} overlaps live {b:#x}+{blen} (device {bd})"
                            ));
                        }
                    }
                    reuse_allowed(driver, m, dev, addr, len, clock, on)?;
                    m.live.insert(addr, (dev, len, size));
                    m.freed.retain(|&f| f < addr || f >= addr + len);
                    driver.with(|s| s.live.insert(addr, (dev, len)));
                }
                Err(CudaError::MEMORY_ALLOCATION) => {
                    let Some(len) = round(size) else {
                        return Ok(Some((dev, Released::Threshold)));
                    };
                    let refused_release = delivered.iter().any(|d| d.0 == Call::Free);
                    let used = held_for_live(&driver.model.segments(), m)[dev as usize];
                    let capacity = m
                        .setup
                        .limit
                        .resolve(m.setup.capacity)
                        .min(m.setup.capacity);
                    let mapped = pool
                        .device_stats(dev)
                        .is_some_and(|s| s.expandable == Expandable::On);
                    // From expandable segments, whole granules: the fewest a hole between
                    // live blocks needs, or all of a new placement's.
                    let need = if mapped && len > SMALL_LIMIT {
                        least_to_map(driver, m, dev, len).map(|(least, fresh)| least.min(fresh))
                    } else {
                        Some(len)
                    };
                    // The driver refused the pool's last request for memory: its answer (a
                    // refused mapping is out of memory once mappings worked).
                    let refused_last = driver.with(|s| s.last_request_injected);
                    // Free granules go back only after a fence: a failed one may leave the
                    // request unserved. Classic segments need none (`cudaFree` waits).
                    let refused_unmap = mapped && delivered.iter().any(|d| d.0 == Call::Fence);
                    let fits = need.and_then(|n| used.checked_add(n));
                    let excused = refused_release || refused_last || refused_unmap;
                    if !excused && fits.is_some_and(|t| t <= capacity) {
                        return Err(format!(
                            "out of memory for {len} bytes (needing {need:?}) with {used} of \
                             {capacity} held for live blocks"
                        ));
                    }
                }
                Err(CudaError(code)) => {
                    if !delivered.contains(&(Call::Malloc, code)) {
                        return Err(format!(
                            "failed with {code}; the driver's failures in this step: {delivered:?}"
                        ));
                    }
                }
            }
            return Ok(Some((dev, Released::Threshold)));
        }
        Op::Free { pick, current }
        | Op::FreeAsync { pick, current, .. }
        | Op::FreeOrdered { pick, current, .. } => {
            let Some((addr, dev, len)) = pick_live(m, pick) else {
                return Ok(None);
            };
            let kind = match *op {
                Op::FreeAsync {
                    blocking, stream, ..
                } => FreeKind::Async { blocking, stream },
                Op::FreeOrdered { stream, .. } => FreeKind::Ordered { stream },
                _ => FreeKind::Sync,
            };
            let out = pool.free(addr, kind, Some(current));
            if out != FreeOutcome::Freed {
                return Err(format!("free of live {addr:#x} gave {out:?}"));
            }
            m.live.remove(&addr);
            driver.with(|s| {
                s.live.remove(&addr);
                s.unfenced_frees.push((dev, addr, len, clock));
            });
            m.freed.push(addr);
            let wait = wait_for(m.setup.reuse, kind, m.beyond_barriers);
            if wait != Wait::Nothing {
                m.dirty.push(Dirty {
                    dev,
                    addr,
                    len,
                    freed_at: clock,
                    wait,
                    stream: match kind {
                        FreeKind::Async { stream, .. } | FreeKind::Ordered { stream } => {
                            Some(stream)
                        }
                        FreeKind::Sync => None,
                    },
                    ordered: matches!(kind, FreeKind::Ordered { .. }),
                });
            }
        }
        Op::Fence { dev } => {
            // The program's synchronization is over before the pool hears of it.
            let seq = pool.seq_before_sync(dev);
            driver.with(|s| s.fenced(dev));
            pool.observe_fence(dev, seq);
            return Ok(Some((dev, Released::Synchronized)));
        }
        Op::Barrier { dev } => {
            let seq = pool.seq_before_sync(dev);
            pool.observe_barrier(dev, seq);
            driver.with(|s| s.last_barrier[dev as usize] = clock);
        }
        Op::BarrierBegin { dev } => {
            if m.begun[dev as usize].is_none() {
                m.begun[dev as usize] = Some((pool.seq_before_sync(dev), clock));
            }
        }
        Op::BarrierEnd { dev } => {
            if let Some((seq, began)) = m.begun[dev as usize].take() {
                pool.observe_barrier(dev, seq);
                driver.with(|s| {
                    let b = &mut s.last_barrier[dev as usize];
                    *b = (*b).max(began);
                });
            }
        }
        Op::Release { dev } => {
            pool.sync_point(dev);
            return Ok(Some((dev, Released::Synchronized)));
        }
        Op::EmptyCache { dev } => {
            pool.empty_cache(dev);
            return Ok(Some((dev, Released::All)));
        }
        Op::SetThreshold { bytes } => {
            pool.set_threshold(bytes);
            for d in pool.used_devices() {
                if pool.threshold(d) != bytes {
                    return Err(format!("device {d}'s threshold is {}", pool.threshold(d)));
                }
            }
        }
        Op::SetDeviceThreshold { dev, bytes } => {
            pool.set_device_threshold(dev, bytes);
            if pool.threshold(dev) != bytes {
                return Err(format!("threshold is {}", pool.threshold(dev)));
            }
        }
        Op::Reset { dev } => {
            // The reset waited for the device's work and freed what `cudaMalloc` gave, not
            // mapped memory: the pool unmaps its granules, then forgets the device.
            driver.with(|s| {
                s.live.retain(|_, v| v.0 != dev);
                s.fenced(dev);
            });
            if !pool.release_mappings_after_reset(dev) {
                pool.forget_device(dev);
            }
            let kept = driver.model.mapped_on(dev);
            if kept > 0 {
                return Err(format!("{kept} bytes still mapped after the reset"));
            }
            driver.model.forget_device(dev);
            m.begun[dev as usize] = None;
            m.live.retain(|_, v| v.0 != dev);
            m.dirty.retain(|d| d.dev != dev);
        }
        Op::MemoryInfo { dev } => {
            if !pool.used_devices().contains(&dev) {
                return Ok(None);
            }
            // The driver's own figures, then the pool's: what it could give back counts as
            // free, so the program sees all it could get, and no more.
            let total = m.setup.capacity;
            let driver_free = total - driver.model.reserved_on(dev);
            let (free, _) = pool.memory_for_program(dev, driver_free, total);
            let room = total.min(pool.limit(dev));
            let could_get =
                room.saturating_sub(held_for_live(&driver.model.segments(), m)[dev as usize]);
            if free != could_get {
                return Err(format!(
                    "reports {free} bytes free; the program could get {could_get} ({room} less \
                     what its live blocks hold)"
                ));
            }
        }
        Op::NonBlockingStream => {
            let barrier = driver.with(|s| s.last_barrier);
            let injected = driver.model.delivered().len();
            pool.note_work_beyond_barriers();
            let failed = driver.model.delivered().len() > injected;
            m.beyond_barriers = true;
            // A barrier orders nothing of the new stream's work: blocks freed before it wait
            // for a fence. Those a barrier made reusable already are safe once the pool's fence
            // here succeeded; if it failed, they are a documented limit.
            for d in &mut m.dirty {
                let reusable = barrier[d.dev as usize] > d.freed_at;
                if d.wait == Wait::Barrier && !(reusable && failed) {
                    d.wait = Wait::Fence;
                }
            }
        }
        Op::WildFree { how, pick } => {
            let addr = match how {
                Wild::Interior => match pick_live(m, pick) {
                    Some((a, _, len)) if len > 512 => {
                        a + 512 * (1 + (pick as u64 % (len / 512 - 1)))
                    }
                    _ => return Ok(None),
                },
                Wild::Double => match m.freed.len() {
                    0 => return Ok(None),
                    n => m.freed[pick % n],
                },
                Wild::Random => 0x7000_0000 + (pick as u64 % 4096) * 512,
            };
            if m.live.contains_key(&addr) {
                return Ok(None);
            }
            let kind = if pick % 2 == 0 {
                FreeKind::Sync
            } else {
                FreeKind::Async {
                    blocking: true,
                    stream: 0,
                }
            };
            let out = pool.free(addr, kind, Some((pick % DEVICES as usize) as u32));
            if out == FreeOutcome::Freed {
                return Err(format!("{how:?} free of {addr:#x} was accepted"));
            }
        }
        Op::Fail { call, code } => {
            driver.model.fail_next(call, code);
        }
    }
    Ok(None)
}

/// A block handed out at `[addr, addr+len)` on `dev` must not overlap a freed range whose wait
/// is not over; ranges it takes over are no longer dirty.
pub(crate) fn reuse_allowed(
    driver: &Driver,
    m: &mut Reference,
    dev: u32,
    addr: Addr,
    len: u64,
    clock: u64,
    on: Option<u64>,
) -> Result<(), String> {
    let stream_order = m.setup.reuse == ReuseMode::Relaxed;
    let (fence, barrier) =
        driver.with(|s| (s.last_fence[dev as usize], s.last_barrier[dev as usize]));
    let end = addr + len;
    let mut kept = Vec::new();
    for d in m.dirty.drain(..) {
        if d.dev != dev || d.addr + d.len <= addr || end <= d.addr {
            kept.push(d);
            continue;
        }
        let covered = match d.wait {
            _ if (stream_order || d.ordered) && on.is_some() && d.stream == on => true,
            Wait::Nothing => true,
            Wait::Barrier => fence.max(barrier) > d.freed_at,
            Wait::Fence => fence > d.freed_at,
        };
        if !covered {
            return Err(format!(
                "handed out {addr:#x}+{len} in step {}, overlapping {:#x}+{} freed in step {} \
                 and waiting for a {:?} (last fence {fence}, last barrier {barrier})",
                clock - 1,
                d.addr,
                d.len,
                d.freed_at - 1,
                d.wait
            ));
        }
        if d.addr < addr {
            kept.push(Dirty {
                len: addr - d.addr,
                ..d
            });
        }
        if d.addr + d.len > end {
            kept.push(Dirty {
                addr: end,
                len: d.addr + d.len - end,
                ..d
            });
        }
    }
    m.dirty = kept;
    Ok(())
}
