//! One wasmtime [`Engine`] per test process and one compiled [`Module`] per `.wasm` file:
//! compiling a plugin takes far longer than instantiating it, so every VM of every test in the
//! process shares the compiled code, and test processes share it through a disk cache
//! (`target/harness-cache/<sha256 of the wasm>.cwasm`, wasmtime's own serialization, which
//! refuses a file from another wasmtime version or engine configuration).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;
use wasmtime::{Config, Engine, Module, OptLevel};

static ENGINE: OnceLock<Engine> = OnceLock::new();
static FUEL_OFF: AtomicBool = AtomicBool::new(false);

/// Turns fuel metering off for this process (every callback's fuel is then 0), for timing
/// the plugins without the metering's overhead. Only before the engine exists (the first
/// VM): errs afterwards.
pub fn disable_fuel_metering() -> crate::Result<()> {
    if ENGINE.get().is_some() && fuel_metering() {
        return Err("the wasmtime engine already exists with fuel metering on".into());
    }
    FUEL_OFF.store(true, Ordering::SeqCst);
    Ok(())
}

/// True if the engine meters fuel (the default).
pub fn fuel_metering() -> bool {
    !FUEL_OFF.load(Ordering::SeqCst)
}

/// The process-wide engine: Cranelift, fuel metering on (every callback's cost is measured)
/// unless [`disable_fuel_metering`] was called first.
pub fn engine() -> &'static Engine {
    ENGINE.get_or_init(|| {
        let mut config = Config::new();
        config.consume_fuel(fuel_metering());
        config.cranelift_opt_level(OptLevel::Speed);
        #[cfg(feature = "profiling")]
        if std::env::var_os("HARNESS_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
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
    let module = Arc::new(compile_cached(&bytes).map_err(|e| format!("{}: {e}", path.display()))?);
    cache.insert(path.to_path_buf(), (modified, module.clone()));
    Ok(module)
}

/// Compiles `wasm`, or loads the code an earlier test process compiled from the same bytes.
fn compile_cached(wasm: &[u8]) -> Result<Module, String> {
    if std::env::var_os("HARNESS_PERFMAP").is_some() {
        // compiled here, so the profiler sees the code (and its names) being published
        return Module::new(engine(), wasm).map_err(|e| format!("cannot compile: {e:#}"));
    }
    let digest = crate::workspace::sha256_hex(wasm);
    let dir = crate::workspace::root()
        .join("target")
        .join("harness-cache");
    // code compiled without fuel metering is another file (wasmtime would refuse it anyway)
    let flavour = if fuel_metering() { "" } else { ".nofuel" };
    let file = dir.join(format!("{digest}{flavour}.cwasm"));
    if file.is_file() {
        if let Ok(module) = load(&file) {
            return Ok(module);
        }
    }
    let module = Module::new(engine(), wasm).map_err(|e| format!("cannot compile: {e:#}"))?;
    // best effort: another process may write the same file; rename is atomic
    if let Ok(code) = module.serialize() {
        let tmp = dir.join(format!("{digest}.{}.tmp", std::process::id()));
        if std::fs::create_dir_all(&dir).is_ok() && std::fs::write(&tmp, code).is_ok() {
            let _ = std::fs::rename(&tmp, &file);
            prune(&dir, 64);
        }
    }
    Ok(module)
}

/// Keeps the `keep` newest files of the cache (each rebuild of a plugin adds one).
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() <= keep {
        return;
    }
    files.sort();
    for (_, path) in files.iter().take(files.len() - keep) {
        let _ = std::fs::remove_file(path);
    }
}

/// Loads compiled code from the cache.
#[allow(unsafe_code)]
fn load(file: &Path) -> Result<Module, String> {
    // SAFETY: the file was written by `Module::serialize` of this engine configuration (the
    // name is the digest of the wasm it came from; written to a temporary file and renamed, so
    // never seen half-written), and wasmtime checks its version and configuration header.
    unsafe { Module::deserialize_file(engine(), file) }.map_err(|e| e.to_string())
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
