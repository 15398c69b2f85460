//! The library's layers point one way. Each file of `src/` (the trace tool aside) is a module;
//! a module that names another (`use crate::a::b`, `super::x`, a path in code) depends on it.
//! There is no cycle of such dependencies, a module's references to its own ancestors aside,
//! and the pool core names nothing outside itself but the configuration: it stays free of CUDA
//! and is tested and replayed offline.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every module of `src/` by path (`pool::device::grow`; `lib.rs` is the empty path), with its
/// source, test modules cut off.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("read src/") {
            let path = entry.expect("entry").path();
            let rel = path.strip_prefix(root).expect("under src/");
            if rel.starts_with("bin") {
                continue;
            }
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let mut name = rel.with_extension("").to_string_lossy().replace('/', "::");
                if name == "lib" {
                    name.clear();
                } else if let Some(parent) = name.strip_suffix("::mod") {
                    name = parent.to_string();
                }
                // Test modules (inline or in files of their own) may use anything.
                if name == "tests" || name.ends_with("::tests") || name.contains("::tests::") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("read a source file");
                let text = match text.find("#[cfg(test)]\nmod tests {") {
                    Some(at) => &text[..at],
                    None => &text[..],
                };
                out.insert(name, without_comments(text));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// `text` without its comments (`//` to the end of the line; no module path sits in a string).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `a::{b, c::{d, e}}` as `[a::b, a::c::d, a::c::e]`.
fn expand(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.split(" as ").next().unwrap_or(path).trim().to_string()];
    };
    let prefix = &path[..open];
    let inner = &path[open + 1..path.rfind('}').unwrap_or(path.len())];
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for ch in inner.chars() {
        match ch {
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            _ => {
                depth += i32::from(ch == '{') - i32::from(ch == '}');
                cur.push(ch);
            }
        }
    }
    parts.push(cur);
    let mut out = Vec::new();
    for p in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        if p == "self" {
            out.push(prefix.trim_end_matches(':').to_string());
        } else {
            out.extend(expand(&format!("{prefix}{p}")));
        }
    }
    out
}

/// The paths `code` names from `crate`, `super` or `self`: in `use` declarations (braces
/// expanded) and written out in code.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let at = from + at;
            from = at + start.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let end = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| at + e);
            out.push(code[at..end].trim_end_matches(':').to_string());
        }
    }
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let stmt = &rest[at + 4..];
        let Some(end) = stmt.find(';') else { break };
        let stmt: String = stmt[..end].split_whitespace().collect();
        if ["crate", "super", "self"]
            .iter()
            .any(|s| stmt.starts_with(s))
            && stmt.contains('{')
        {
            out.extend(expand(&stmt));
        }
        rest = &rest[at + 4..];
    }
    out
}

/// The module `path`, named in module `from`, refers to: the longest prefix that is a module.
fn resolve(from: &str, path: &str, mods: &BTreeMap<String, String>) -> Option<String> {
    let mut parts: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").collect()
    };
    match parts.first() {
        Some(&"crate") => {
            base.clear();
            parts.remove(0);
        }
        Some(&"super") | Some(&"self") => {
            while let Some(&p) = parts.first() {
                match p {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                parts.remove(0);
            }
        }
        _ => return None,
    }
    (0..=parts.len()).rev().find_map(|k| {
        let cand = base
            .iter()
            .chain(&parts[..k])
            .copied()
            .collect::<Vec<_>>()
            .join("::");
        mods.contains_key(&cand).then_some(cand)
    })
}

/// Each module's dependencies, references to its own ancestors left out.
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules();
    mods.iter()
        .map(|(name, code)| {
            let deps = paths(code)
                .iter()
                .filter_map(|p| resolve(name, p, &mods))
                .filter(|t| t != name && !t.is_empty() && !name.starts_with(&format!("{t}::")))
                .collect();
            (name.clone(), deps)
        })
        .collect()
}

/// Every cycle of `deps`, each as `a -> b -> ... -> a`.
fn cycles(deps: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    // Depth-first search; a module reached again while on the path closes a cycle.
    fn visit(
        m: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == m) {
            found.push(format!("{} -> {m}", path[at..].join(" -> ")));
            return;
        }
        if !done.insert(m.to_string()) {
            return;
        }
        path.push(m.to_string());
        for d in deps.get(m).into_iter().flatten() {
            visit(d, deps, path, done, found);
        }
        path.pop();
    }
    let mut found = Vec::new();
    for m in deps.keys() {
        visit(m, deps, &mut Vec::new(), &mut BTreeSet::new(), &mut found);
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn no_module_depends_on_itself_through_others() {
    let found = cycles(&dependencies());
    assert!(found.is_empty(), "dependency cycles:\n{}", found.join("\n"));
}

#[test]
fn the_pool_core_names_only_itself_and_the_configuration() {
    let outside: Vec<String> = dependencies()
        .into_iter()
        .filter(|(m, _)| m == "pool" || m.starts_with("pool::"))
        .flat_map(|(m, deps)| {
            deps.into_iter()
                .filter(|d| !(d == "pool" || d.starts_with("pool::") || d == "config"))
                .map(move |d| format!("{m} -> {d}"))
        })
        .collect();
    assert!(outside.is_empty(), "{outside:?}");
}

#[test]
fn the_checker_sees_dependencies_and_cycles() {
    // Both forms of path are read, or the tests above prove nothing.
    let deps = dependencies();
    assert!(
        deps["hooks::runtime"].contains("dispatch"),
        "{:?}",
        deps["hooks::runtime"]
    );
    assert!(
        deps["lifecycle"].contains("global"),
        "{:?}",
        deps["lifecycle"]
    );
    assert!(
        deps["pool::device"].contains("pool::size"),
        "{:?}",
        deps["pool::device"]
    );
    assert_eq!(
        expand("crate::a::{b, c::{d, e as f}, self}"),
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e",
            "crate::a"
        ]
    );
    let graph: BTreeMap<String, BTreeSet<String>> =
        [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
            .iter()
            .map(|(m, d)| (m.to_string(), BTreeSet::from([d.to_string()])))
            .collect();
    assert_eq!(
        cycles(&graph),
        ["a -> b -> c -> a", "b -> c -> a -> b", "c -> a -> b -> c"]
    );
}
