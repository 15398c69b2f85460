//! The allocation trace: every decision a device pool makes, as fixed-size binary records.
//!
//! Records are appended under the device's lock into a per-device buffer and handed to a sink in
//! large chunks, so tracing costs a clock read and a 40-byte copy per event. Within a device the
//! order of records is the order the pool applied them, which is what lets `replay` reproduce a
//! run exactly; records of different devices interleave by chunk.
//!
//! File layout: the 8-byte magic `GPTRACE1`, then records of `RECORD_SIZE` bytes, little-endian:
//! `t_ns u64 | a u64 | b u64 | c u64 | thread u32 | kind u8 | device u8 | aux u16`.
//!
//! Compatibility: a kind keeps its number and the meaning of its fields; new kinds take the
//! next numbers, and what a new setting changes is a record of its own after `Settings` (as
//! `Limit` and `Expandable` are). So every older trace reads as it was written, and an older
//! reader refuses a newer trace by the kind it does not know, rather than misread it.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::size::ALIGN;

pub const MAGIC: &[u8; 8] = b"GPTRACE1";
pub const RECORD_SIZE: usize = 40;
/// A device's buffer is handed to the sink when it holds this many bytes.
const FLUSH_BYTES: usize = 64 * 1024;

/// What a record says. The meaning of `a`, `b`, `c` and `aux` per kind is documented on each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The device's pool was made: `a` max split size, `b` fence bytes, `c` threshold,
    /// `aux` reuse mode (0 strict, 1 barrier, 2 relaxed).
    Settings = 0,
    /// An allocation served: `a` requested bytes, `b` address, `c` block size, `aux` the
    /// stream it is for (`gpupool_malloc_async`): 0 none, else the device's number for the
    /// stream, from 1 in order of first use.
    Alloc = 1,
    /// An allocation the pool could not serve: `a` requested bytes, `b` error code (2: out of
    /// memory after releasing the cache and retrying).
    AllocFailed = 2,
    /// A block given back: `a` address, `b` what its reuse waits for (0 nothing, 1 barrier,
    /// 2 fence), `c` block size, `aux` how in its low two bits (0 `cudaFree`, 1 `cudaFreeAsync`
    /// on a blocking stream, 2 on a non-blocking stream) and the stream's number (as for
    /// `Alloc`) above them.
    Free = 3,
    /// A segment from the driver: `a` address, `b` size.
    SegmentAlloc = 4,
    /// The driver refused a segment: `a` size, `b` error code. With `aux`
    /// `SEGMENT_BEYOND_MEMORY`, the pool did not ask: the device had less free.
    SegmentRefused = 5,
    /// A segment given back to the driver: `a` address, `b` size, `aux` why (0 threshold,
    /// 1 empty cache, 2 out of memory, 3 outgrown by a larger request).
    SegmentFree = 6,
    /// A fence the pool took: `a` nanoseconds the host waited.
    Fence = 7,
    /// A barrier the pool issued.
    Barrier = 8,
    /// The program synchronized: `a` fence sequence, `b` barrier sequence now covered.
    Observe = 9,
    /// A release point (a program synchronization): the threshold was applied.
    SyncPoint = 10,
    /// An explicit empty-cache request, keeping at most `a` bytes reserved (0: all free).
    EmptyCache = 11,
    /// The release threshold changed: `a` bytes; `b` 1 when they bound the reserved bytes (a
    /// threshold the program set on CUDA's default memory pool), 0 the cached ones.
    Threshold = 12,
    /// `cudaDeviceReset`: the pool forgot the device.
    Reset = 13,
    /// The program made work no barrier orders: a non-blocking stream, or a context of its own
    /// (recorded once per device, when it first happens or after `Settings` for a device used
    /// later). From here on, `barrier` mode makes every free wait for a fence, as `need_for`
    /// says. Older traces record only non-blocking streams here; a replay reads both alike.
    BeyondBarriers = 14,
    /// The pool's limit (`GPUPOOL_LIMIT`): `a` bytes it may reserve on the device. Recorded
    /// after `Settings` when a limit is in force.
    Limit = 15,
    /// Blocks come from expandable segments (`GPUPOOL_EXPANDABLE`, and the driver maps
    /// memory): `a` the granule, `b` the address space each range reserves. Recorded after
    /// `Settings`; a trace without it was recorded with classic segments only.
    Expandable = 16,
    /// An expandable segment's address range reserved (nothing mapped yet): `a` address, `b`
    /// size.
    RangeReserved = 17,
    /// The driver refused a range (the request got a classic segment): `a` size, `b` error code.
    RangeRefused = 18,
    /// One granule of memory mapped into a range: `a` address, `b` size.
    Map = 19,
    /// The driver refused to map a granule: `a` address, `b` size, `c` error code. With `aux`
    /// `MAP_BEYOND_MEMORY`, the pool did not ask: the block lacked more than the device had free.
    MapRefused = 20,
    /// A granule unmapped and its memory given back: `a` address, `b` size, `aux` why (as
    /// `SegmentFree`'s, 4: undoing a mapping refused half-way, 5: moved within the slack, 6:
    /// after a device reset).
    Unmap = 21,
    /// The mapped slack (`GPUPOOL_EXPANDABLE_SLACK`): `a` thousandths of the peak allocated.
    /// Recorded after `Settings` when the slack is on.
    MappedSlack = 22,
}

/// `SegmentRefused`'s `aux` when the pool refused the segment itself: the device had less
/// free than it.
pub const SEGMENT_BEYOND_MEMORY: u16 = 1;
/// `MapRefused`'s `aux` when the pool refused the mapping itself, before any granule was
/// mapped: what the block lacked was more than the device had free.
pub const MAP_BEYOND_MEMORY: u16 = 1;
/// `Unmap`'s `aux` for the granules a refused mapping had mapped (after `Release`'s codes).
pub const UNMAP_UNDONE: u16 = 4;
/// `Unmap`'s `aux` for a granule unmapped so that a block elsewhere could be mapped within the
/// mapped slack (`GPUPOOL_EXPANDABLE_SLACK`).
pub const UNMAP_SLACK: u16 = 5;
/// `Unmap`'s `aux` for the granules a device reset made the pool give back (the `Reset`
/// record follows them).
pub const UNMAP_RESET: u16 = 6;

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        use Kind::*;
        Some(match v {
            0 => Settings,
            1 => Alloc,
            2 => AllocFailed,
            3 => Free,
            4 => SegmentAlloc,
            5 => SegmentRefused,
            6 => SegmentFree,
            7 => Fence,
            8 => Barrier,
            9 => Observe,
            10 => SyncPoint,
            11 => EmptyCache,
            12 => Threshold,
            13 => Reset,
            14 => BeyondBarriers,
            15 => Limit,
            16 => Expandable,
            17 => RangeReserved,
            18 => RangeRefused,
            19 => Map,
            20 => MapRefused,
            21 => Unmap,
            22 => MappedSlack,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub t_ns: u64,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub thread: u32,
    pub kind: Kind,
    pub device: u8,
    pub aux: u16,
}

impl Record {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.t_ns.to_le_bytes());
        out.extend_from_slice(&self.a.to_le_bytes());
        out.extend_from_slice(&self.b.to_le_bytes());
        out.extend_from_slice(&self.c.to_le_bytes());
        out.extend_from_slice(&self.thread.to_le_bytes());
        out.push(self.kind as u8);
        out.push(self.device);
        out.extend_from_slice(&self.aux.to_le_bytes());
    }

    pub fn decode(r: &[u8]) -> Option<Record> {
        if r.len() < RECORD_SIZE {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(Record {
            t_ns: u64_at(0),
            a: u64_at(8),
            b: u64_at(16),
            c: u64_at(24),
            thread: u32::from_le_bytes(r[32..36].try_into().ok()?),
            kind: Kind::from_u8(r[36])?,
            device: r[37],
            aux: u16::from_le_bytes(r[38..40].try_into().ok()?),
        })
    }
}

/// Parse a whole trace file. Returns the records, or why it is not a trace. A truncated last
/// record (a process killed mid-write) is ignored. Each device's records must start with its
/// settings, hold them once, and never go back in time (the pool writes them in order under
/// the device's lock): bytes shifted by a lost or partial chunk break that at once, where they
/// would otherwise pass for records with absurd sizes.
pub fn parse(bytes: &[u8]) -> Result<Vec<Record>, String> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Err("a gzip-compressed file: decompress it first (gzip -dk FILE)".into());
    }
    let body = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or("not a gpupool trace (bad magic)")?;
    // Per device: the time of its last record, once its settings were seen.
    let mut last: Vec<Option<u64>> = vec![None; 256];
    body.chunks_exact(RECORD_SIZE)
        .enumerate()
        .map(|(i, c)| {
            let r =
                Record::decode(c).ok_or_else(|| format!("record {i}: unknown kind {}", c[36]))?;
            let corrupt = |why: &str| {
                format!(
                    "record {i}: {why} (device {}): the trace is corrupt, or was written by a \
                     process whose writes failed",
                    r.device
                )
            };
            let seen = &mut last[usize::from(r.device)];
            match (*seen, r.kind) {
                (None, Kind::Settings) => {}
                (None, _) => return Err(corrupt("a record before the device's settings")),
                (Some(_), Kind::Settings) => return Err(corrupt("the device's settings again")),
                (Some(t), _) if r.t_ns < t => return Err(corrupt("time goes back")),
                // A replay maps in these granules and ranges: the pool records a power of two
                // of at least `ALIGN`, and a range a whole number of them.
                (Some(_), Kind::Expandable)
                    if !(r.a.is_power_of_two() && r.a >= ALIGN)
                        || r.b == 0
                        || !r.b.is_multiple_of(r.a) =>
                {
                    return Err(corrupt(&format!(
                        "expandable segments of {} B ranges in {} B granules",
                        r.b, r.a
                    )))
                }
                (Some(_), _) => {}
            }
            *seen = Some(r.t_ns);
            Ok(r)
        })
        .collect()
}

/// Where full buffers go (a file, in the library).
pub trait TraceSink: Send + Sync {
    fn write(&self, bytes: &[u8]);
    /// Whether records still go anywhere: a file that could not be made, or whose write failed,
    /// takes none, and the pool then stops recording and runs as without a trace.
    fn on(&self) -> bool {
        true
    }
}

/// A small per-thread number for records (stable for the thread's life, no system call).
fn thread_number() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    thread_local! {
        static ID: Cell<u32> = const { Cell::new(0) };
    }
    ID.try_with(|id| {
        if id.get() == 0 {
            id.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        id.get()
    })
    .unwrap_or(0)
}

/// One device's trace buffer.
pub struct TraceBuf {
    sink: Arc<dyn TraceSink>,
    start: Instant,
    device: u8,
    buf: Vec<u8>,
}

impl TraceBuf {
    pub fn new(sink: Arc<dyn TraceSink>, start: Instant, device: u32) -> Self {
        TraceBuf {
            sink,
            start,
            device: device.min(255) as u8,
            buf: Vec::with_capacity(FLUSH_BYTES + RECORD_SIZE),
        }
    }

    /// Record one event; `false` once the sink takes no more (`TraceSink::on`).
    pub fn record(&mut self, kind: Kind, a: u64, b: u64, c: u64, aux: u16) -> bool {
        Record {
            t_ns: self.start.elapsed().as_nanos() as u64,
            a,
            b,
            c,
            thread: thread_number(),
            kind,
            device: self.device,
            aux,
        }
        .encode(&mut self.buf);
        if self.buf.len() >= FLUSH_BYTES {
            return self.flush();
        }
        self.on()
    }

    /// Whether the sink still takes records (`TraceSink::on`).
    pub fn on(&self) -> bool {
        self.sink.on()
    }

    /// Hand the buffered records to the sink; `false` once it takes no more.
    pub fn flush(&mut self) -> bool {
        if !self.buf.is_empty() {
            self.sink.write(&self.buf);
            self.buf.clear();
        }
        self.on()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let r = Record {
            t_ns: 123_456_789,
            a: u64::MAX,
            b: 0x7f00_0000_1000,
            c: 512,
            thread: 7,
            kind: Kind::Free,
            device: 3,
            aux: 65535,
        };
        let settings = Record {
            kind: Kind::Settings,
            t_ns: 0,
            ..r
        };
        let mut v = MAGIC.to_vec();
        settings.encode(&mut v);
        r.encode(&mut v);
        assert_eq!(v.len(), 8 + 2 * RECORD_SIZE);
        // A truncated tail is ignored.
        v.extend_from_slice(&[1, 2, 3]);
        assert_eq!(parse(&v).unwrap(), vec![settings, r]);
        assert!(parse(b"nonsense").is_err());
        let mut bad = MAGIC.to_vec();
        settings.encode(&mut bad);
        Record {
            kind: Kind::Reset,
            ..r
        }
        .encode(&mut bad);
        bad[8 + RECORD_SIZE + 36] = 200;
        assert!(parse(&bad).is_err());
        assert!(parse(&[0x1f, 0x8b, 8, 0]).unwrap_err().contains("gzip"));
    }

    /// The records of expandable segments (the setting, a range, granules mapped, refused and
    /// unmapped) read back as written, after the settings they follow; a trace written before
    /// they existed reads as before.
    #[test]
    fn mapping_records_round_trip() {
        let rec = |t_ns, kind, a, b, c, aux| Record {
            t_ns,
            a,
            b,
            c,
            thread: 2,
            kind,
            device: 1,
            aux,
        };
        let g = 2 << 20;
        let base = 0x7f00_0000_0000;
        let written = [
            rec(1, Kind::Settings, u64::MAX, 64 << 20, u64::MAX, 0),
            rec(1, Kind::Expandable, g, 160 << 30, 0, 0),
            rec(2, Kind::RangeRefused, 160 << 30, 2, 0, 0),
            rec(3, Kind::RangeReserved, base, 160 << 30, 0, 0),
            rec(4, Kind::Map, base, g, 0, 0),
            rec(5, Kind::MapRefused, base + g, g, 2, 0),
            rec(6, Kind::Unmap, base, g, 0, UNMAP_UNDONE),
            rec(7, Kind::Unmap, base + 4 * g, g, 0, 1),
        ];
        let mut v = MAGIC.to_vec();
        written.iter().for_each(|r| r.encode(&mut v));
        assert_eq!(parse(&v).unwrap(), written);
        // An older trace: settings and a segment, no mapping records.
        let mut old = MAGIC.to_vec();
        written[0].encode(&mut old);
        rec(2, Kind::SegmentAlloc, base, 20 << 20, 0, 0).encode(&mut old);
        assert_eq!(parse(&old).unwrap().len(), 2);
    }

    /// A device's records start with its settings, hold them once and keep time; records
    /// shifted by a partial chunk fail those checks.
    #[test]
    fn a_shifted_or_disordered_trace_is_refused() {
        let rec = |t_ns, kind, device| Record {
            t_ns,
            a: 4096,
            b: 0x7f00_0000_1000,
            c: 4096,
            thread: 1,
            kind,
            device,
            aux: 0,
        };
        let encode = |rs: &[Record]| {
            let mut v = MAGIC.to_vec();
            rs.iter().for_each(|r| r.encode(&mut v));
            v
        };
        let good = [
            rec(1, Kind::Settings, 0),
            rec(5, Kind::Alloc, 0),
            rec(2, Kind::Settings, 1),
            rec(3, Kind::Alloc, 1),
            rec(5, Kind::Free, 0),
        ];
        assert_eq!(parse(&encode(&good)).unwrap(), good);
        for bad in [
            [rec(1, Kind::Alloc, 0), rec(2, Kind::Settings, 0)],
            [rec(1, Kind::Settings, 0), rec(2, Kind::Settings, 0)],
            [rec(9, Kind::Settings, 0), rec(8, Kind::Alloc, 0)],
        ] {
            assert!(parse(&encode(&bad)).is_err(), "{bad:?}");
        }
        // 32 bytes of a chunk lost: what follows is read 8 bytes off.
        let mut shifted = encode(&good[..2]);
        let tail = encode(&good[2..]);
        shifted.extend_from_slice(&tail[8 + 32..]);
        shifted.extend_from_slice(&encode(&[rec(9, Kind::Alloc, 0); 4])[8..]);
        assert!(parse(&shifted).is_err());
        for k in 0..=22u8 {
            assert_eq!(Kind::from_u8(k).map(|k| k as u8), Some(k));
        }
        assert_eq!(Kind::from_u8(23), None);
    }
}
