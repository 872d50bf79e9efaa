//! The runtime both models run on: one thread pool and one GEMM backend, made once per process
//! from one host/device/ab choice.
//!
//! A model registers its linears with [`Runtime::register`] and keeps the typed
//! [`LinearHandle`]s it gets back; every projection then goes through [`Runtime::gemm_group`]. The
//! runtime numbers the weights itself, so the decoder and the vision tower share one backend (and
//! one set of resident device weights) without either knowing the other's ids. `Runtime` is a
//! cheap handle (clone it to share): the backend sits behind a mutex that each GEMM takes once,
//! uncontended in a step (nanoseconds beside a GEMM's microseconds).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use packs::{Linear, LinearIndex, Pack};

use crate::ab::AbGemm;
use crate::backend::{AbReport, BackendError, GemmBackend, GemmStats, WeightRef};
use crate::device::{DeviceConfig, DeviceGemm};
use crate::host::HostGemm;
use crate::kernels::Products;
use crate::pool::{new_pool, PoolError};

/// Where the matrix products run: the one statement of it every front end maps onto (`--gemm`,
/// the C ABI's request, the probes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum GemmChoice {
    /// Every GEMM on the CPU.
    #[default]
    Host,
    /// Every projection on the NPU runtime (real, or the software NPU).
    Device,
    /// Both, compared GEMM by GEMM; the host's result is used.
    Ab,
}

impl GemmChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            GemmChoice::Host => "host",
            GemmChoice::Device => "device",
            GemmChoice::Ab => "ab",
        }
    }
}

impl std::fmt::Display for GemmChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a runtime is made of.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// Threads of the persistent pool (GEMMs, attention, the tower).
    pub threads: usize,
    pub gemm: GemmChoice,
    /// The NPU runtime and designs, for `GemmChoice::Device` and `Ab`.
    pub device: DeviceConfig,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            threads: default_threads(),
            gemm: GemmChoice::Host,
            device: DeviceConfig::default(),
        }
    }
}

impl RuntimeOptions {
    /// The host backend on `threads` threads.
    pub fn host(threads: usize) -> RuntimeOptions {
        RuntimeOptions {
            threads,
            ..RuntimeOptions::default()
        }
    }
}

/// Every hardware thread.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Where a registered linear lives in its pack: a table entry, or the LM head (which may be the
/// tied embedding and has no table entry of its own).
#[derive(Clone, Copy, Debug)]
pub enum PackLinear {
    Table(LinearIndex),
    Head,
    /// The head's first rows (the logits of the first token ids only): made by
    /// [`PackLinear::head_rows`], which checks the count against the pack.
    HeadRows(usize),
}

impl PackLinear {
    /// The head's first `rows` rows, if that is a prefix of it ([`Linear::first_rows`]).
    pub fn head_rows(pack: &Pack, rows: usize) -> Option<PackLinear> {
        pack.head()
            .first_rows(rows)
            .map(|_| PackLinear::HeadRows(rows))
    }

    pub fn resolve<'p>(self, pack: &'p Pack) -> Linear<'p> {
        match self {
            PackLinear::Table(at) => pack.linear_at(at),
            PackLinear::Head => pack.head(),
            PackLinear::HeadRows(rows) => pack
                .head()
                .first_rows(rows)
                .expect("a prefix of the head: checked by PackLinear::head_rows"),
        }
    }
}

/// A linear made resident on the runtime's backend: only [`Runtime::register`] makes one.
#[derive(Clone, Copy, Debug)]
pub struct LinearHandle {
    /// u32 keeps the handle at 24 bytes with `products` (models hold many; ids stay far below).
    id: u32,
    at: PackLinear,
    products: Products,
}

impl LinearHandle {
    /// The backend's view of the weight (its id and bytes in `pack`).
    pub fn weight<'p>(&self, pack: &'p Pack) -> WeightRef<'p> {
        WeightRef {
            id: self.id as usize,
            linear: self.at.resolve(pack),
            products: self.products,
        }
    }
    /// The arithmetic of the weight's products if it is stored bf16.
    pub fn products(&self) -> Products {
        self.products
    }
    /// The backend id (ids are dense from 0 in registration order).
    pub fn id(&self) -> usize {
        self.id as usize
    }
    pub fn at(&self) -> PackLinear {
        self.at
    }
}

struct Backend {
    gemm: Box<dyn GemmBackend>,
    /// The id the next registered linear gets.
    next_id: usize,
}

struct Inner {
    pool: Arc<rayon::ThreadPool>,
    backend: Mutex<Backend>,
    /// Held for a whole model pass ([`Runtime::pass`]).
    pass: Mutex<()>,
}

/// The pool and the GEMM backend, shared by the models of one process.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl Runtime {
    /// The pool and the backend `options` ask for (the device is opened here, once).
    pub fn new(options: &RuntimeOptions) -> Result<Runtime, RuntimeError> {
        let pool = new_pool(options.threads)?;
        let gemm: Box<dyn GemmBackend> = match options.gemm {
            GemmChoice::Host => Box::new(HostGemm::new(pool.clone())),
            GemmChoice::Device => Box::new(DeviceGemm::open(&options.device)?),
            GemmChoice::Ab => Box::new(AbGemm::new(
                HostGemm::new(pool.clone()),
                DeviceGemm::open(&options.device)?,
            )),
        };
        Ok(Runtime::with_backend(pool, gemm))
    }

    /// The host backend on `threads` threads.
    pub fn host(threads: usize) -> Result<Runtime, RuntimeError> {
        Runtime::new(&RuntimeOptions::host(threads))
    }

    /// A backend of the caller's (tests plant faulty ones; benchmarks pick kernels) on `pool`.
    pub fn with_backend(pool: Arc<rayon::ThreadPool>, gemm: Box<dyn GemmBackend>) -> Runtime {
        Runtime {
            inner: Arc::new(Inner {
                pool,
                backend: Mutex::new(Backend { gemm, next_id: 0 }),
                pass: Mutex::new(()),
            }),
        }
    }

    /// The persistent pool every GEMM, attention and tower op forks on.
    pub fn pool(&self) -> &Arc<rayon::ThreadPool> {
        &self.inner.pool
    }

    /// Runs `f` (a decoder step, a tower encode) on a thread of the pool, one pass at a time.
    ///
    /// Why one at a time: a GEMM holds the backend's lock while its tasks run on the pool, and a
    /// pool thread waiting for them may pick up any job queued on the pool. If a second pass were
    /// queued from another thread, that thread could start it and block on the lock its own
    /// stack holds: a deadlock (a tower encode on a server worker's thread beside a decoder step
    /// on the scheduler's). Inside one pass GEMMs are issued one after another, so the lock is
    /// never wanted by a stolen task.
    pub fn pass<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let _one_pass = self.inner.pass.lock().unwrap_or_else(|p| p.into_inner());
        self.inner.pool.install(f)
    }

    pub fn threads(&self) -> usize {
        self.inner.pool.current_num_threads()
    }

    fn backend(&self) -> MutexGuard<'_, Backend> {
        // A panic inside a GEMM poisons the lock; the backend's state is still whole (a GEMM
        // writes only its output), so later calls go on.
        self.inner
            .backend
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes `linears` of `pack` resident (a device backend uploads them here) and returns their
    /// handles, in order, with f32 products. All or nothing: a weight the backend refuses leaves
    /// nothing registered.
    pub fn register(
        &self,
        pack: &Pack,
        linears: &[PackLinear],
    ) -> Result<Vec<LinearHandle>, BackendError> {
        self.register_with(pack, linears, Products::F32)
    }

    /// [`Runtime::register`] with the arithmetic the bf16-stored ones among `linears` multiply by.
    pub fn register_with(
        &self,
        pack: &Pack,
        linears: &[PackLinear],
        products: Products,
    ) -> Result<Vec<LinearHandle>, BackendError> {
        let mut backend = self.backend();
        let first = backend.next_id;
        let handles: Vec<LinearHandle> = linears
            .iter()
            .enumerate()
            .map(|(i, &at)| LinearHandle {
                id: u32::try_from(first + i).expect("fewer than 2^32 linears"),
                at,
                products,
            })
            .collect();
        let refs: Vec<WeightRef<'_>> = handles.iter().map(|h| h.weight(pack)).collect();
        backend.gemm.prepare(&refs)?;
        backend.next_id += handles.len();
        Ok(handles)
    }

    /// `y[rows x n] = x[rows x k] · Wᵀ` for the registered weight `w` of `pack`.
    pub fn gemm(
        &self,
        pack: &Pack,
        w: LinearHandle,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), BackendError> {
        self.backend().gemm.gemm(&w.weight(pack), x, rows, y)
    }

    /// Weights `ws` applied to the same input, `ys[i] = x · ws[i]ᵀ` (a device backend quantizes
    /// the input once and keeps every run in flight).
    pub fn gemm_group<const N: usize>(
        &self,
        pack: &Pack,
        ws: [LinearHandle; N],
        x: &[f32],
        rows: usize,
        mut ys: [&mut [f32]; N],
    ) -> Result<(), BackendError> {
        let refs = ws.map(|w| w.weight(pack));
        self.backend().gemm.gemm_group(&refs, x, rows, &mut ys)
    }

    /// The backend's name (`host`, `device`, `ab`, or a custom one's).
    pub fn backend_name(&self) -> &'static str {
        self.backend().gemm.name()
    }

    /// With `--gemm ab`: how host and device compared so far.
    pub fn ab_report(&self) -> Option<AbReport> {
        self.backend().gemm.ab_report()
    }

    /// The backend's counters since the last call.
    pub fn take_stats(&self) -> GemmStats {
        self.backend().gemm.take_stats()
    }

    /// How many weights are registered (the next handle's id).
    pub fn registered(&self) -> usize {
        self.backend().next_id
    }
}

/// The designs directory and runtime library a front end was given, as a device configuration.
pub fn device_config(
    runtime: Option<PathBuf>,
    designs: Option<PathBuf>,
    program: &str,
) -> DeviceConfig {
    DeviceConfig {
        runtime,
        designs,
        program: program.to_string(),
        ..DeviceConfig::default()
    }
}
