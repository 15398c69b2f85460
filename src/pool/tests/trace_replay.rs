//! Traces (`trace.rs`) and their replay (`replay.rs`): a replay with the recorded settings gives
//! the live run's figures.

use super::*;

/// A trace held in memory.
struct MemoryTrace(Mutex<Vec<u8>>);

impl TraceSink for MemoryTrace {
    fn write(&self, bytes: &[u8]) {
        self.0.lock().unwrap().extend_from_slice(bytes);
    }
}

impl MemoryTrace {
    /// The records written so far (after `Pool::flush_trace`).
    fn records(&self) -> Vec<trace::Record> {
        trace::parse(&self.0.lock().unwrap()).unwrap()
    }
}

/// A `relaxed` pool that traces into memory.
fn traced_relaxed() -> (Pool<ModelDriver>, Arc<MemoryTrace>) {
    let sink = Arc::new(MemoryTrace(Mutex::new(trace::MAGIC.to_vec())));
    let mut settings = relaxed().settings().clone();
    settings.trace = Some(Arc::clone(&sink) as Arc<dyn TraceSink>);
    (Pool::new(model(80 << 30), settings), sink)
}

#[test]
fn a_trace_with_stream_ordered_reuse_replays_to_the_same_figures() {
    let (p, sink) = traced_relaxed();
    // Three streams and plain cudaMalloc/cudaFree; blocks freed mostly on their own stream.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut live: Vec<(Addr, Option<StreamKey>)> = Vec::new();
    for _ in 0..20_000 {
        let r = next();
        if live.len() > 40 || (!live.is_empty() && r % 2 == 0) {
            let (a, s) = live.swap_remove((r >> 8) as usize % live.len());
            let how = match (s, r >> 16 & 7) {
                (None, _) => FreeKind::Sync,
                (Some(s), 0) => on((s + 1) % 3, true),
                (Some(s), k) => on(s, k != 1),
            };
            assert_eq!(p.free(a, how, Some(0)), FreeOutcome::Freed);
        } else {
            let stream = (r >> 8) % 4;
            let stream = (stream < 3).then_some(stream);
            let size = [512, 4096, 300 << 10, 3 * MIB, 12 * MIB, 40 * MIB][(r >> 24) as usize % 6];
            live.push((p.alloc_on(0, size, stream).unwrap(), stream));
        }
    }
    p.check().unwrap();
    p.flush_trace();
    let live_stats = stats(&p, 0);
    assert!(live_stats.stream_hits > 1000, "{}", live_stats.stream_hits);
    let records = sink.records();
    let r = replay::replay(&records, &replay::Overrides::default());
    assert!(!r[0].diverged);
    let s = &r[0].stats;
    assert_eq!(
        (
            s.stream_hits,
            s.hits,
            s.real_mallocs,
            s.barriers,
            s.reserved.peak_ever()
        ),
        (
            live_stats.stream_hits,
            live_stats.hits,
            live_stats.real_mallocs,
            live_stats.barriers,
            live_stats.reserved.peak_ever()
        )
    );
}

/// The runtime's own `cudaFreeAsync` in `strict` mode: its blocks serve the stream that freed
/// them at once; the trace records that kind of free and the replay gives the live figures.
/// Replayed as PyTorch's uncached route would make the same calls, every block waits for a
/// fence instead.
#[test]
fn ordered_frees_in_strict_mode_are_traced_and_replayed_and_their_route_compared() {
    let sink = Arc::new(MemoryTrace(Mutex::new(trace::MAGIC.to_vec())));
    let mut settings = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30)
        .settings()
        .clone();
    settings.trace = Some(Arc::clone(&sink) as Arc<dyn TraceSink>);
    let p = Pool::new(model(80 << 30), settings);
    let sizes = [4096, 300 << 10, 3 * MIB, 12 * MIB];
    for step in 0..400u64 {
        let a: Vec<Addr> = sizes
            .iter()
            .map(|&n| p.alloc_on(0, n + step % 7 * 512, Some(3)).unwrap())
            .collect();
        for x in a {
            assert_eq!(
                p.free(x, FreeKind::Ordered { stream: 3 }, Some(0)),
                FreeOutcome::Freed
            );
        }
    }
    p.check().unwrap();
    p.flush_trace();
    let live = stats(&p, 0);
    assert!(live.stream_hits > 1000, "{}", live.stream_hits);
    let records = sink.records();
    let r = &replay::replay(&records, &replay::Overrides::default())[0];
    assert!(!r.diverged);
    assert_eq!(
        (
            r.stats.stream_hits,
            r.stats.real_mallocs,
            r.stats.reserved.peak_ever()
        ),
        (
            live.stream_hits,
            live.real_mallocs,
            live.reserved.peak_ever()
        )
    );
    let uncached = replay::Overrides {
        route: replay::Route::Uncached,
        ..Default::default()
    };
    let u = &replay::replay(&records, &uncached)[0].stats;
    assert_eq!(u.stream_hits, 0);
    assert!(u.reserved.peak_ever() > live.reserved.peak_ever());
}

/// A threshold set for one device (`gpupool_set_release_threshold(0, ...)`) is in the trace as
/// one set for every device is, so the replay releases where the live run did (without it,
/// the replay keeps the segment and peaks 40 MiB higher).
#[test]
fn a_per_device_threshold_is_traced_and_replayed() {
    let (p, sink) = traced_relaxed();
    assert!(p.set_device_threshold(0, 0));
    let a = p.alloc_on(0, 100 * MIB, None).unwrap();
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    p.sync_point(0);
    let b = p.alloc_on(0, 60 * MIB, None).unwrap();
    let c = p.alloc_on(0, 60 * MIB, None).unwrap();
    p.check().unwrap();
    p.flush_trace();
    let live = stats(&p, 0);
    assert_eq!(
        live.reserved.peak_ever(),
        120 * MIB,
        "the 100 MiB segment went back"
    );
    let r = replay::replay(&sink.records(), &replay::Overrides::default());
    assert!(!r[0].diverged);
    assert_eq!(
        (
            r[0].stats.reserved.peak_ever(),
            r[0].stats.real_mallocs,
            r[0].stats.real_frees
        ),
        (
            live.reserved.peak_ever(),
            live.real_mallocs,
            live.real_frees
        )
    );
    for x in [b, c] {
        assert_eq!(p.free(x, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
}

/// A program that creates a non-blocking stream makes `barrier` mode fence (`need_for`): a
/// trace records it, so that a replay in `barrier` mode of a trace recorded in another mode
/// does what the live pool would have done (without the record, it takes barriers throughout).
#[test]
fn a_barrier_replay_fences_once_the_trace_says_a_non_blocking_stream_was_made() {
    let run = |reuse: ReuseMode| {
        let sink = Arc::new(MemoryTrace(Mutex::new(trace::MAGIC.to_vec())));
        let mut settings = pool_with(reuse, DeviceBytes::Unbounded, 1)
            .settings()
            .clone();
        settings.trace = Some(Arc::clone(&sink) as Arc<dyn TraceSink>);
        let p = Pool::new(model(80 << 30), settings);
        let churn = |rounds: usize| {
            for _ in 0..rounds {
                let blocks: Vec<Addr> = (0..8).map(|_| p.alloc(0, 4 * MIB).unwrap()).collect();
                for a in blocks {
                    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
                }
            }
        };
        churn(20);
        p.note_work_beyond_barriers();
        churn(20);
        p.flush_trace();
        (stats(&p, 0), sink.records())
    };
    let (live, live_records) = run(ReuseMode::Barrier);
    assert!(live.barriers > 0 && live.fences > 0, "{live:?}");
    let marks = |records: &[trace::Record]| {
        records
            .iter()
            .filter(|r| r.kind == trace::Kind::BeyondBarriers)
            .count()
    };
    assert_eq!(marks(&live_records), 1);
    let (_, strict_records) = run(ReuseMode::Strict);
    assert_eq!(marks(&strict_records), 1);
    let barrier = replay::Overrides {
        reuse: Some(ReuseMode::Barrier),
        ..Default::default()
    };
    let r = &replay::replay(&strict_records, &barrier)[0].stats;
    assert_eq!(
        (r.fences, r.barriers, r.real_mallocs, r.reserved.peak_ever()),
        (
            live.fences,
            live.barriers,
            live.real_mallocs,
            live.reserved.peak_ever()
        )
    );
    // Without the record, the replay takes barriers only.
    let unmarked: Vec<trace::Record> = strict_records
        .into_iter()
        .filter(|r| r.kind != trace::Kind::BeyondBarriers)
        .collect();
    assert_eq!(replay::replay(&unmarked, &barrier)[0].stats.fences, 0);
}

/// The trace numbers streams up to 16 383; later ones share the last number (rather than
/// wrapping round past 65 535 streams, which panics in a debug build).
#[test]
fn trace_stream_numbers_saturate_past_16383_streams() {
    let (p, sink) = traced_relaxed();
    for s in 0..65_540u64 {
        let a = p.alloc_on(0, 512, Some(1000 + s)).unwrap();
        p.free(a, FreeKind::Sync, None);
    }
    p.flush_trace();
    let records = sink.records();
    let ids: Vec<u16> = records
        .iter()
        .filter(|r| r.kind == trace::Kind::Alloc)
        .map(|r| r.aux)
        .collect();
    assert_eq!(ids.len(), 65_540);
    let wrong: Vec<(usize, u16)> = ids
        .iter()
        .enumerate()
        .filter(|&(i, &id)| usize::from(id) != (i + 1).min((1 << 14) - 1))
        .map(|(i, &id)| (i, id))
        .collect();
    assert!(
        wrong.is_empty(),
        "streams numbered wrongly: {:?}",
        &wrong[..wrong.len().min(5)]
    );
}

/// A pool on a device of `capacity` bytes, tracing into memory, with expandable segments on a
/// driver that maps memory, or classic segments.
fn traced_with(
    reuse: ReuseMode,
    capacity: u64,
    expandable: bool,
) -> (Pool<ModelDriver>, Arc<MemoryTrace>) {
    traced_with_slack(reuse, capacity, expandable, None)
}

/// `traced_with`, with a mapped slack of `slack` thousandths.
fn traced_with_slack(
    reuse: ReuseMode,
    capacity: u64,
    expandable: bool,
    slack: Option<u32>,
) -> (Pool<ModelDriver>, Arc<MemoryTrace>) {
    let sink = Arc::new(MemoryTrace(Mutex::new(trace::MAGIC.to_vec())));
    let mut settings = pool_with(reuse, DeviceBytes::Unbounded, 1)
        .settings()
        .clone();
    settings.trace = Some(Arc::clone(&sink) as Arc<dyn TraceSink>);
    settings.expandable = expandable;
    settings.policy.mapped_slack_permille = slack;
    let driver = ModelDriver::new()
        .with_capacity(capacity)
        .with_gap(GUARD_GAP);
    let driver = if expandable {
        driver.with_vmm()
    } else {
        driver
    };
    (Pool::new(driver, settings), sink)
}

/// Fills the device with 7 MiB blocks, frees every other one, then fills it with 14 MiB blocks:
/// the 7 MiB blocks (the freed ones included) and the 14 MiB ones.
fn half_free_then_twice_the_size<B: Backend>(p: &Pool<B>) -> (Vec<Addr>, Vec<Addr>) {
    let blocks: Vec<Addr> = std::iter::from_fn(|| p.alloc(0, 7 * MIB).ok()).collect();
    for &a in blocks.iter().step_by(2) {
        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
    let big: Vec<Addr> = std::iter::from_fn(|| p.alloc(0, 14 * MIB).ok()).collect();
    assert!(!big.is_empty());
    (blocks, big)
}

/// A device filled with 7 MiB blocks, every other one freed, then filled with 14 MiB blocks:
/// mappings refused at the device's end, free granules unmapped before the retries, an
/// empty-cache at the end. The trace records the setting, the range and every granule, and the
/// replay with the recorded settings maps, unmaps and peaks as the live run did.
#[test]
fn a_trace_recorded_with_expandable_segments_replays_to_the_same_reserved_peak() {
    for reuse in [ReuseMode::Strict, ReuseMode::Relaxed] {
        let (p, sink) = traced_with(reuse, 1 << 30, true);
        let (blocks, big) = half_free_then_twice_the_size(&p);
        for &a in blocks.iter().skip(1).step_by(2).chain(&big) {
            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
        }
        p.empty_cache(0);
        p.check().unwrap();
        p.flush_trace();
        let live = stats(&p, 0);
        let counts = p.backend().counts();
        let records = sink.records();
        let kinds = |k| records.iter().filter(|r| r.kind == k).count() as u64;
        assert_eq!(kinds(trace::Kind::Expandable), 1);
        assert_eq!(kinds(trace::Kind::RangeReserved), 1);
        assert_eq!(
            kinds(trace::Kind::Map) + kinds(trace::Kind::MapRefused),
            counts.maps
        );
        assert_eq!(kinds(trace::Kind::Unmap), counts.unmaps);
        assert!(kinds(trace::Kind::MapRefused) > 0, "the device ran out");
        let r = &replay::replay(&records, &replay::Overrides::default())[0];
        assert!(!r.diverged, "{reuse:?}");
        assert!(r.expandable);
        assert_eq!(
            (
                r.stats.reserved.peak_ever(),
                r.stats.reserved.current,
                r.stats.ooms,
                r.stats.oom_recovered,
                r.maps,
                r.unmaps,
                r.failed
            ),
            (
                live.reserved.peak_ever(),
                live.reserved.current,
                live.ooms,
                live.oom_recovered,
                counts.maps - kinds(trace::Kind::MapRefused),
                counts.unmaps,
                0
            ),
            "{reuse:?}"
        );
    }
}

/// A device that ends inside a granule serves its last part with segments of the requests'
/// own size, and refuses them without asking once less is free: the trace records both, and
/// the replay, which cannot know the free memory, takes the same decisions.
#[test]
fn segments_at_a_device_end_inside_a_granule_replay_as_recorded() {
    let (p, sink) = traced_with(ReuseMode::Strict, 147 * 7 * MIB, true);
    let (blocks, big) = half_free_then_twice_the_size(&p);
    for &a in blocks.iter().skip(1).step_by(2).chain(&big) {
        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
    p.flush_trace();
    let live = stats(&p, 0);
    let records = sink.records();
    let kinds = |k| records.iter().filter(|r| r.kind == k).count();
    assert!(kinds(trace::Kind::SegmentAlloc) > 0, "a segment at the end");
    let not_asked = records
        .iter()
        .filter(|r| r.kind == trace::Kind::SegmentRefused && r.aux == trace::SEGMENT_BEYOND_MEMORY);
    assert!(not_asked.count() > 0, "refused without asking");
    let r = &replay::replay(&records, &replay::Overrides::default())[0];
    assert!(!r.diverged);
    // The segments refused without asking were no `cudaMalloc` in the live run: nor in the
    // replay.
    assert_eq!(
        (
            r.stats.reserved.peak_ever(),
            r.stats.ooms,
            r.failed,
            r.stats.real_mallocs
        ),
        (live.reserved.peak_ever(), live.ooms, 0, live.real_mallocs)
    );
}

/// The granules the summary counts mapped and unmapped are the driver's `cuMemMap` and
/// `cuMemUnmap` calls that went through, as the trace records them: also the mappings undone
/// when a later granule of the same block was refused, each a map and an unmap. The replay
/// counts them so too.
#[test]
fn granules_mapped_and_unmapped_count_the_mappings_undone_at_a_refusal() {
    for reuse in [ReuseMode::Strict, ReuseMode::Relaxed] {
        let (p, sink) = traced_with(reuse, 1 << 30, true);
        half_free_then_twice_the_size(&p);
        p.flush_trace();
        let live = stats(&p, 0);
        let records = sink.records();
        let kinds = |k| records.iter().filter(|r| r.kind == k).count() as u64;
        let undone = records
            .iter()
            .filter(|r| r.kind == trace::Kind::Unmap && r.aux == trace::UNMAP_UNDONE)
            .count();
        assert!(undone > 0, "{reuse:?}: no mapping was undone");
        assert_eq!(
            (live.granules_mapped, live.granules_unmapped),
            (kinds(trace::Kind::Map), kinds(trace::Kind::Unmap)),
            "{reuse:?}"
        );
        let counts = p.backend().counts();
        assert_eq!(
            live.granules_mapped,
            counts.maps - kinds(trace::Kind::MapRefused)
        );
        assert_eq!(live.granules_unmapped, counts.unmaps);
        // The peak reserved counts what a mapping refused half-way held: the highest of the
        // driver's holdings as the records follow them, a segment or a granule at a time.
        let (mut held, mut peak) = (0u64, 0u64);
        for r in &records {
            match r.kind {
                trace::Kind::SegmentAlloc | trace::Kind::Map => held += r.b,
                trace::Kind::SegmentFree | trace::Kind::Unmap => held -= r.b,
                _ => {}
            }
            peak = peak.max(held);
        }
        assert_eq!(live.reserved.peak_ever(), peak, "{reuse:?}");
        let r = &replay::replay(&records, &replay::Overrides::default())[0];
        assert!(!r.diverged, "{reuse:?}");
        assert_eq!(
            (r.maps, r.unmaps, r.stats.reserved.peak_ever()),
            (live.granules_mapped, live.granules_unmapped, peak),
            "{reuse:?}"
        );
    }
}

/// A reset gives every granule back (`unmap_all_after_reset`): those unmaps are driver calls
/// too. The summary counts them, so that the granules mapped less those unmapped are still
/// what is mapped; the trace records them, and the replay makes them again.
#[test]
fn the_granules_a_reset_unmaps_are_counted_recorded_and_replayed() {
    let (p, sink) = traced_with(ReuseMode::Strict, 1 << 30, true);
    let kept: Vec<Addr> = (0..3).map(|_| p.alloc(0, 8 * MIB).unwrap()).collect();
    p.free(kept[1], FreeKind::Sync, Some(0));
    assert!(p.release_mappings_after_reset(0));
    let after = p.alloc(0, 8 * MIB).unwrap();
    p.flush_trace();
    let live = stats(&p, 0);
    let snap = p.device_stats(0).unwrap();
    assert_eq!(snap.figures.mapped, 8 * MIB);
    assert_eq!(
        (live.granules_mapped - live.granules_unmapped) * crate::pool::model_driver::VMM_GRANULE,
        snap.figures.mapped,
        "{live:?}"
    );
    assert_eq!(live.granules_unmapped, p.backend().counts().unmaps);
    let records = sink.records();
    let kinds = |k| records.iter().filter(|r| r.kind == k).count() as u64;
    assert_eq!(
        (kinds(trace::Kind::Map), kinds(trace::Kind::Unmap)),
        (live.granules_mapped, live.granules_unmapped)
    );
    let r = &replay::replay(&records, &replay::Overrides::default())[0];
    assert!(!r.diverged);
    assert_eq!(
        (r.maps, r.unmaps, r.stats.reserved.peak_ever()),
        (
            live.granules_mapped,
            live.granules_unmapped,
            live.reserved.peak_ever()
        )
    );
    p.free(after, FreeKind::Sync, Some(0));
}

/// The stranding workload, 7 MiB blocks (two per 20 MiB segment, 6 MiB stranded in
/// each): recorded with expandable segments on or off, a replay answers for both. With them,
/// the peak is the blocks and less than a granule; without, a 20 MiB segment per two blocks.
#[test]
fn replays_with_and_without_expandable_segments_differ_on_a_stranding_workload() {
    let blocks = 100u64;
    for recorded_on in [true, false] {
        let (p, sink) = traced_with(ReuseMode::Strict, 80 << 30, recorded_on);
        let records = run_7mib(&p, &sink);
        let peak = |expandable| {
            let o = replay::Overrides {
                expandable,
                ..Default::default()
            };
            let r = &replay::replay(&records, &o)[0];
            assert_eq!(r.failed, 0);
            r.stats.reserved.peak_ever()
        };
        let (on, off, recorded) = (peak(Some(true)), peak(Some(false)), peak(None));
        println!("recorded with expandable {recorded_on}: on {on}, off {off}");
        assert!(
            on >= blocks * 7 * MIB && on < blocks * 7 * MIB + 2 * MIB,
            "{on}"
        );
        assert_eq!(off, blocks / 2 * 20 * MIB);
        assert_eq!(recorded, if recorded_on { on } else { off });
    }
}

/// 100 blocks of 7 MiB, then all freed: the trace's records.
fn run_7mib<B: Backend>(p: &Pool<B>, sink: &MemoryTrace) -> Vec<trace::Record> {
    let blocks: Vec<Addr> = (0..100).map(|_| p.alloc(0, 7 * MIB).unwrap()).collect();
    for a in blocks {
        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
    p.flush_trace();
    sink.records()
}

/// A trace recorded with a mapped slack records it, and its moves; the replay moves the same
/// granules, and answers without the slack too.
#[test]
fn a_trace_recorded_with_a_mapped_slack_replays_its_moves() {
    let (p, sink) = traced_with_slack(ReuseMode::Strict, 16 << 30, true, Some(40));
    let a = p.alloc(0, 100 * MIB).unwrap();
    let b = p.alloc(0, 100 * MIB).unwrap();
    for _ in 0..40 {
        let x = p.alloc(0, 64 * MIB).unwrap();
        p.free(x, FreeKind::Sync, Some(0));
    }
    p.free(a, FreeKind::Sync, Some(0));
    let d = p.alloc(0, 150 * MIB).unwrap();
    for x in [b, d] {
        p.free(x, FreeKind::Sync, Some(0));
    }
    p.check().unwrap();
    p.flush_trace();
    let live = stats(&p, 0);
    assert!(live.slack_unmapped_granules > 0);
    let records = sink.records();
    let slack: Vec<_> = records
        .iter()
        .filter(|r| r.kind == trace::Kind::MappedSlack)
        .collect();
    assert_eq!(slack.len(), 1);
    assert_eq!(slack[0].a, 40);
    let moved = records
        .iter()
        .filter(|r| r.kind == trace::Kind::Unmap && r.aux == trace::UNMAP_SLACK)
        .count() as u64;
    assert_eq!(moved, live.slack_unmapped_granules);
    let r = &replay::replay(&records, &replay::Overrides::default())[0];
    assert!(!r.diverged);
    assert_eq!(
        (
            r.stats.reserved.peak_ever(),
            r.stats.slack_unmapped_granules
        ),
        (live.reserved.peak_ever(), live.slack_unmapped_granules)
    );
    let off = replay::Overrides {
        mapped_slack_permille: Some(None),
        ..replay::Overrides::default()
    };
    let r = &replay::replay(&records, &off)[0];
    assert_eq!(r.stats.slack_unmapped_granules, 0);
    assert!(r.stats.reserved.peak_ever() > live.reserved.peak_ever());
}
