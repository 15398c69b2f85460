//! The model driver as this test wraps it: what it checks beyond the model driver's own checks.

use super::*;

/// What this test checks beyond the model driver: the step that is running, per device the
/// last step in which a fence / barrier succeeded, the reference model's live blocks
/// (base → (device, rounded bytes)), to catch a segment released or a granule unmapped with a
/// live block in it, the frees no fence has covered yet (device, base, bytes, step), to catch a
/// granule unmapped under work that may still run, and the granules mapped.
#[derive(Default)]
pub(crate) struct Checks {
    pub(crate) clock: u64,
    pub(crate) last_fence: [u64; DEVICES as usize],
    pub(crate) last_barrier: [u64; DEVICES as usize],
    pub(crate) live: BTreeMap<Addr, (u32, u64)>,
    pub(crate) unfenced_frees: Vec<(u32, Addr, u64, u64)>,
    /// The memory mapped (`vmm_map`) and not unmapped: address → (device, bytes). The
    /// driver's other segments are classic ones.
    pub(crate) mappings: BTreeMap<Addr, (u32, u64)>,
    /// The address ranges reserved (`vmm_reserve`) and not freed: base → (device, bytes).
    pub(crate) ranges: BTreeMap<Addr, (u32, u64)>,
    /// The last request for memory in this step (a segment or a mapping) met a failure the
    /// test injected: the pool may pass that refusal on.
    pub(crate) last_request_injected: bool,
    pub(crate) violations: Vec<String>,
}

impl Checks {
    /// A fence on `device` in this step: every free before it is covered.
    pub(crate) fn fenced(&mut self, device: u32) {
        let clock = self.clock;
        self.last_fence[device as usize] = clock;
        self.unfenced_frees
            .retain(|&(d, _, _, at)| d != device || at >= clock);
    }
}

/// The pool core's model driver (a capacity per device, never-reused addresses, injected
/// failures, virtual memory when the setup turns expandable segments on), with the checks
/// above.
pub(crate) struct Driver {
    pub(crate) model: ModelDriver,
    pub(crate) checks: Mutex<Checks>,
}

impl Driver {
    pub(crate) fn new(capacity: u64, vmm: bool) -> Self {
        let model = ModelDriver::new()
            .with_capacity(capacity)
            .with_gap(GUARD_GAP);
        Driver {
            model: if vmm { model.with_vmm() } else { model },
            checks: Mutex::new(Checks::default()),
        }
    }

    /// `request`, a call for memory, noting whether it met an injected failure.
    pub(crate) fn requesting<E>(&self, request: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let before = self.model.delivered().len();
        let r = request();
        let injected = self.model.delivered().len() > before;
        self.with(|s| s.last_request_injected = injected);
        r
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Checks) -> T) -> T {
        f(&mut self.checks.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl AsRef<ModelDriver> for Driver {
    fn as_ref(&self) -> &ModelDriver {
        &self.model
    }
}

impl ModelWrapper for Driver {
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let mut addr = 0;
        self.requesting(|| {
            addr = self.model.alloc_segment(device, bytes)?;
            Ok(())
        })?;
        Ok(addr)
    }

    fn free_segment(&self, device: u32, addr: Addr) -> Result<(), CudaError> {
        let segment = self.model.release(device, addr)?;
        self.with(|s| {
            if let Some((b, _)) = s.live.range(addr..addr + segment.bytes).next() {
                let bytes = segment.bytes;
                s.violations.push(format!(
                    "released segment {addr:#x}+{bytes} with live block {b:#x} in it"
                ));
            }
        });
        Ok(())
    }

    fn fence(&self, device: u32) -> Result<(), CudaError> {
        self.model.fence(device)?;
        self.with(|s| s.fenced(device));
        Ok(())
    }

    fn barrier(&self, device: u32) -> Result<(), CudaError> {
        self.model.barrier(device)?;
        self.with(|s| s.last_barrier[device as usize] = s.clock);
        Ok(())
    }

    fn vmm_reserve(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let addr = self.model.vmm_reserve(device, bytes)?;
        self.with(|s| s.ranges.insert(addr, (device, bytes)));
        Ok(addr)
    }

    fn vmm_free_reservation(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.model.vmm_free_reservation(device, addr, bytes)?;
        self.with(|s| s.ranges.remove(&addr));
        Ok(())
    }

    fn vmm_map(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.requesting(|| self.model.vmm_map(device, addr, bytes))?;
        self.with(|s| s.mappings.insert(addr, (device, bytes)));
        Ok(())
    }

    /// `cuMemUnmap` waits for nothing: the granule must hold no live block, and no block
    /// freed since the last fence (a kernel issued before the free may still run on it; a
    /// barrier is no host wait).
    fn vmm_unmap(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        let end = addr + bytes;
        self.with(|s| {
            // Live blocks do not overlap: only the last one starting before `end` can reach in.
            if let Some((&b, &(d, len))) = s.live.range(..end).next_back() {
                if b + len > addr {
                    s.violations.push(format!(
                        "unmapped {addr:#x}+{bytes} in step {} under live {b:#x}+{len} (device \
                         {d})",
                        (s.clock - 1) / 2
                    ));
                }
            }
            if let Some(&(_, b, len, at)) = s
                .unfenced_frees
                .iter()
                .find(|&&(d, b, len, _)| d == device && b < end && addr < b + len)
            {
                s.violations.push(format!(
                    "unmapped {addr:#x}+{bytes} in step {} over {b:#x}+{len}, freed in step {} \
                     and no fence since",
                    (s.clock - 1) / 2,
                    (at - 1) / 2
                ));
            }
        });
        self.model.vmm_unmap(device, addr, bytes)?;
        self.with(|s| s.mappings.remove(&addr));
        Ok(())
    }
}
