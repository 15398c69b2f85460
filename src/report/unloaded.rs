//! Objects unloaded (`dlclose`) while blocks they allocated were live: their names, for the
//! reports. An unloaded object's addresses resolve to nothing, or to the object the dynamic
//! linker mapped there since, so the blocks' origins are rewritten to an index in this table
//! (`interpose::dlclose`).

use std::sync::Mutex;

use crate::pool::Origin;

/// The bit that marks an origin as an index into `NAMES`: never set in a user-space address.
const TAG: Origin = 1 << 63;

/// The unloaded objects' paths, each once: bounded by the distinct objects a program unloads.
static NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The origin that stands for the unloaded object at `path` from now on.
pub fn remember(path: String) -> Origin {
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let i = match names.iter().position(|n| *n == path) {
        Some(i) => i,
        None => {
            names.push(path);
            names.len() - 1
        }
    };
    TAG | i as Origin
}

/// The path of the unloaded object `origin` stands for, if it stands for one.
pub fn path_of(origin: Origin) -> Option<String> {
    if origin & TAG == 0 {
        return None;
    }
    let names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    names.get((origin & !TAG) as usize).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unloaded_object_keeps_one_origin_and_its_path() {
        let a = remember("/opt/a/libplugin.so".into());
        assert_eq!(remember("/opt/a/libplugin.so".into()), a);
        let b = remember("/opt/b/libother.so".into());
        assert_ne!(a, b);
        assert_eq!(path_of(a).as_deref(), Some("/opt/a/libplugin.so"));
        assert_eq!(path_of(b).as_deref(), Some("/opt/b/libother.so"));
        assert_eq!(path_of(0x7f00_1234_5678), None);
    }
}
