//! The pool's fence of the contexts the program made (`tests/c/own_context_fence.c`, linked with
//! the runtime and `-lcuda`), on two simulated devices: what a fence of one device may wait for.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use support::{number, ok, pooled, unpooled};

const DEVICES: [(&str, &str); 3] = [
    ("CUDASIM_DEVICES", "2"),
    ("CUDASIM_MEM", "1GiB"),
    ("CUDASIM_CONTEXT_BYTES", "0"),
];

fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| support::c_program_with_driver("own_context_fence"))
        .clone()
}

fn run(mode: &str, arg: &str) -> String {
    let (out, err) = ok(&mut pooled(&program(), &[mode, arg], &DEVICES));
    assert!(
        out.ends_with(&format!("own_context_fence {mode} ok\n")),
        "{out}\n{err}"
    );
    out
}

#[test]
fn a_fence_of_a_context_the_program_made_holds_back_no_other_device() {
    // The main thread's fence of device 0 waits 1.5 s for a kernel in the program's own context
    // there. A thread on device 1, where no context of the program's lives and nothing runs,
    // fences, synchronizes or makes a context meanwhile: none of it waits for device 0's
    // kernel (reuse-modes.md: "Without peer access a fence stays one device's"). Were it to,
    // a kernel on device 0 that waits for device 1's half of a collective would never end.
    for what in ["fence", "sync", "create"] {
        let out = run("other-device", what);
        assert!(number::<f64>(&out, "fence_ms=") >= 1000.0, "{what}: {out}");
        assert_eq!(number::<u64>(&out, "busy_after_fence="), 0, "{what}: {out}");
        let other = number::<f64>(&out, "other_ms=");
        assert!(
            other < 500.0,
            "{what} on device 1 waited for device 0: {out}"
        );
    }
}

#[test]
fn a_context_destroyed_while_a_fence_synchronizes_it() {
    // The destroy waits for the fence that synchronizes the context; a second fence of the
    // device and another context made and destroyed meanwhile neither hang nor fail.
    let out = run("destroy-during-fence", "");
    assert_eq!(number::<u64>(&out, "destroyed="), 1, "{out}");
    assert_eq!(number::<u64>(&out, "busy_after_fence="), 0, "{out}");
}

#[test]
fn a_context_made_on_a_device_whose_primary_context_is_unused_leaves_it_unused() {
    // A thread that made no CUDA call yet makes a context of its own on device 1, whose
    // primary context nothing used, while the pool serves device 0. Without the pool that
    // primary context stays inactive; the pool must not make it (on a GPU it takes memory).
    // In `barrier` mode the creation ends barriers (a fence of device 0), which must not
    // make it either, and the new context stays the thread's.
    let (out, err) = ok(&mut unpooled(&program(), &["create-unused"], &DEVICES));
    assert_eq!(number::<i32>(&out, "primary1_after="), 0, "{out}\n{err}");
    for reuse in ["strict", "barrier", "relaxed"] {
        let env: Vec<(&str, &str)> = DEVICES
            .iter()
            .copied()
            .chain([("GPUPOOL_REUSE", reuse)])
            .collect();
        let (out, err) = ok(&mut pooled(&program(), &["create-unused"], &env));
        assert!(
            out.ends_with("own_context_fence create-unused ok\n"),
            "{out}\n{err}"
        );
        assert_eq!(number::<i32>(&out, "primary1_before="), 0, "{reuse}: {out}");
        assert_eq!(
            number::<i32>(&out, "primary1_after="),
            0,
            "{reuse}: the pool made device 1's primary context: {out}\n{err}"
        );
        assert_eq!(number::<i32>(&out, "own_current="), 1, "{reuse}: {out}");
    }
}
