//! One wasmtime [`Engine`] per test process and one compiled [`Module`] per `.wasm` file:
//! compiling a plugin takes far longer than instantiating it, so every VM of every test in the
//! process shares the compiled code.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;
use wasmtime::{Config, Engine, Module, OptLevel};

/// The process-wide engine: Cranelift, fuel metering on (every callback's cost is measured).
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut config = Config::new();
        config.consume_fuel(true);
        config.cranelift_opt_level(OptLevel::Speed);
        Engine::new(&config).unwrap_or_else(|e| panic!("cannot create the wasmtime engine: {e}"))
    })
}

type Cache = Mutex<HashMap<PathBuf, (Option<SystemTime>, Arc<Module>)>>;

/// The compiled module of `path`, compiled on first use (and again if the file changed).
pub fn module(path: &Path) -> crate::Result<Arc<Module>> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    let modified = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .modified()
        .ok();
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((seen, module)) = cache.get(path) {
        if *seen == modified {
            return Ok(module.clone());
        }
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let module = Arc::new(
        Module::new(engine(), &bytes)
            .map_err(|e| format!("cannot compile {}: {e:#}", path.display()))?,
    );
    cache.insert(path.to_path_buf(), (modified, module.clone()));
    Ok(module)
}

/// The imports of a module as `module::name`, for tests and error messages.
pub fn imports(module: &Module) -> Vec<String> {
    module
        .imports()
        .map(|i| format!("{}::{}", i.module(), i.name()))
        .collect()
}

/// The exports of a module.
pub fn exports(module: &Module) -> Vec<String> {
    module.exports().map(|e| e.name().to_string()).collect()
}
