//! Who allocated the live blocks, rewritten when the object that did is unloaded: its
//! addresses would resolve to nothing, or to the next object mapped there.

use super::*;

impl<B: Backend> Pool<B> {
    /// Every block of every device allocated from an address in `from` (an object just
    /// unloaded) is recorded as allocated by `to` (`report::unloaded`), in the device's blocks
    /// and in the blocks thread caches handed out.
    pub fn rename_origins(&self, from: std::ops::Range<Origin>, to: Origin) {
        for d in self.used_devices() {
            let Some(slot) = self.existing(d) else {
                continue;
            };
            let mut p = Self::lock(slot);
            p.rename_origins(&from, to);
            for c in slot.caches.caches() {
                let mut st = c.state.lock();
                if st.generation != p.generation {
                    continue;
                }
                for o in st.out.values_mut() {
                    if from.contains(&o.origin) {
                        o.origin = to;
                    }
                }
            }
        }
    }
}
