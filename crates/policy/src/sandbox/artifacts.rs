//! Compiled modules remembered for the life of the process. Compiling a component with Cranelift
//! is the dearest part of loading a policy (the built-in catalog and YAML guard: ~0.4 s of CPU in
//! a release build, more in a debug one), and a reload compiled every module again, the unchanged
//! built-in ones too. Here the machine code of the last few modules compiled is kept, keyed by
//! the module's exact bytes, and a module seen before is loaded from it instead of compiled.
//!
//! Only what this process compiled is ever loaded: the code is kept in its memory and never read
//! from a file or from anyone else. Loading checks the code against the engine at hand (target,
//! wasm features, and tunables such as fuel and epoch interruption) and refuses code compiled
//! under another configuration, which is then compiled afresh.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use wasmtime::component::Component;
use wasmtime::Engine;

/// Modules remembered: the built-in catalog and YAML guard, and a few operator modules.
const MAX_ENTRIES: usize = 8;
/// Bytes remembered (modules and their code together); a module larger than this is compiled
/// every time.
const MAX_BYTES: usize = 64 << 20;

struct Entry {
    /// The module as given, compared whole: a hit is the same module, not the same hash.
    wasm: Box<[u8]>,
    /// Its code, as [`Component::serialize`] wrote it.
    code: Arc<[u8]>,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.wasm.len() + self.code.len()
    }
}

/// The remembered modules, oldest first, within their bounds.
pub(crate) struct Artifacts {
    entries: Mutex<VecDeque<Entry>>,
    max_entries: usize,
    max_bytes: usize,
}

/// The process's own.
static REMEMBERED: Artifacts = Artifacts::new(MAX_ENTRIES, MAX_BYTES);

/// `wasm` compiled for `engine`, or loaded from the code of an earlier compile of the same bytes.
pub(crate) fn compile(engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Component> {
    REMEMBERED.compile(engine, wasm)
}

impl Artifacts {
    const fn new(max_entries: usize, max_bytes: usize) -> Artifacts {
        Artifacts {
            entries: Mutex::new(VecDeque::new()),
            max_entries,
            max_bytes,
        }
    }

    pub(crate) fn compile(&self, engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Component> {
        if let Some(code) = self.recall(wasm) {
            // SAFETY: `code` is what `Component::serialize` wrote in this process (`remember`
            // below is the only way in), kept in this process's memory, never read from outside
            // it. `deserialize` checks it against `engine`'s configuration and refuses code
            // compiled under another one, which is compiled afresh below.
            if let Ok(component) = unsafe { Component::deserialize(engine, &*code) } {
                return Ok(component);
            }
        }
        let component = Component::new(engine, wasm)?;
        if let Ok(code) = component.serialize() {
            self.remember(wasm, code);
        }
        Ok(component)
    }

    fn recall(&self, wasm: &[u8]) -> Option<Arc<[u8]>> {
        let entries = self.entries.lock();
        entries
            .iter()
            .find(|entry| *entry.wasm == *wasm)
            .map(|entry| entry.code.clone())
    }

    fn remember(&self, wasm: &[u8], code: Vec<u8>) {
        let entry = Entry {
            wasm: wasm.into(),
            code: code.into(),
        };
        if entry.bytes() > self.max_bytes {
            return;
        }
        let mut entries = self.entries.lock();
        // The same module compiled again (under another configuration): the newer code replaces it.
        entries.retain(|kept| *kept.wasm != *wasm);
        let mut total: usize = entries.iter().map(Entry::bytes).sum::<usize>() + entry.bytes();
        while entries.len() >= self.max_entries || total > self.max_bytes {
            let Some(oldest) = entries.pop_front() else {
                break;
            };
            total -= oldest.bytes();
        }
        entries.push_back(entry);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().len()
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.entries.lock().iter().map(Entry::bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::Config;

    /// A component exporting nothing, made distinct by a custom section (its name).
    fn empty_component(name: &str) -> Vec<u8> {
        // The component preamble (magic, version 0x0d, layer 1), then a custom section.
        let mut wasm = b"\0asm\x0d\0\x01\0".to_vec();
        let mut section = vec![name.len() as u8];
        section.extend_from_slice(name.as_bytes());
        wasm.push(0);
        wasm.push(section.len() as u8);
        wasm.extend_from_slice(&section);
        wasm
    }

    fn engine(fuel: bool) -> Engine {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.consume_fuel(fuel);
        Engine::new(&config).unwrap()
    }

    #[test]
    fn a_module_seen_before_is_loaded_from_its_code_not_compiled() {
        let artifacts = Artifacts::new(MAX_ENTRIES, MAX_BYTES);
        let wasm = empty_component("a");
        artifacts.compile(&engine(true), &wasm).unwrap();
        let code = artifacts.recall(&wasm).expect("remembered");
        // Another engine of the same configuration loads the same code.
        artifacts.compile(&engine(true), &wasm).unwrap();
        assert!(Arc::ptr_eq(&code, &artifacts.recall(&wasm).unwrap()));
        assert_eq!(artifacts.len(), 1);
    }

    #[test]
    fn code_compiled_under_another_configuration_is_not_loaded() {
        let artifacts = Artifacts::new(MAX_ENTRIES, MAX_BYTES);
        let wasm = empty_component("a");
        artifacts.compile(&engine(true), &wasm).unwrap();
        let with_fuel = artifacts.recall(&wasm).unwrap();
        let engine = engine(false);
        // SAFETY: code this test just compiled.
        assert!(
            unsafe { Component::deserialize(&engine, &*with_fuel) }.is_err(),
            "wasmtime refuses code compiled with fuel for an engine without"
        );
        artifacts.compile(&engine, &wasm).unwrap();
        let without = artifacts.recall(&wasm).unwrap();
        assert!(!Arc::ptr_eq(&with_fuel, &without), "compiled afresh");
        assert_eq!(artifacts.len(), 1, "the newer code replaced the older");
    }

    #[test]
    fn different_bytes_are_different_modules_and_the_oldest_goes_first() {
        let artifacts = Artifacts::new(MAX_ENTRIES, MAX_BYTES);
        let engine = engine(true);
        let modules: Vec<Vec<u8>> = (0..MAX_ENTRIES + 2)
            .map(|n| empty_component(&n.to_string()))
            .collect();
        for wasm in &modules {
            artifacts.compile(&engine, wasm).unwrap();
        }
        assert_eq!(artifacts.len(), MAX_ENTRIES);
        assert!(artifacts.recall(&modules[0]).is_none());
        assert!(artifacts.recall(&modules[1]).is_none());
        for wasm in &modules[2..] {
            assert!(artifacts.recall(wasm).is_some());
        }
    }

    #[test]
    fn the_bytes_kept_stay_under_their_bound() {
        let engine = engine(true);
        let one = {
            let artifacts = Artifacts::new(MAX_ENTRIES, MAX_BYTES);
            artifacts.compile(&engine, &empty_component("0")).unwrap();
            artifacts.bytes()
        };
        // Room for two modules of about this size, not three.
        let artifacts = Artifacts::new(MAX_ENTRIES, 2 * one + one / 2);
        let modules: Vec<Vec<u8>> = (0..5).map(|n| empty_component(&n.to_string())).collect();
        for wasm in &modules {
            artifacts.compile(&engine, wasm).unwrap();
            assert!(
                artifacts.bytes() <= 2 * one + one / 2,
                "{} kept",
                artifacts.bytes()
            );
        }
        assert_eq!(artifacts.len(), 2, "the two newest");
        assert!(artifacts.recall(&modules[4]).is_some());
        // A module larger than the whole bound is compiled and loaded, and not kept.
        let tight = Artifacts::new(MAX_ENTRIES, one / 2);
        tight.compile(&engine, &modules[0]).unwrap();
        assert_eq!(tight.len(), 0);
    }

    #[test]
    fn a_module_that_does_not_compile_is_an_error_and_not_remembered() {
        let artifacts = Artifacts::new(MAX_ENTRIES, MAX_BYTES);
        let error = artifacts
            .compile(&engine(true), b"\0asm\x0d\0\x01\0\xff")
            .unwrap_err();
        assert!(!format!("{error:#}").is_empty());
        assert_eq!(artifacts.len(), 0);
    }
}
