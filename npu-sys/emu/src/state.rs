//! The software NPU's objects and the registry that maps handles to them. A handle is a registry
//! id, never an address, so a stale or foreign handle is refused instead of dereferenced.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::abi::{self, EmuError};
use crate::compute;
use crate::design::{check_design_files, group_name, Geometry};
use crate::faults::{threads_from_env, Fault, Faults};
use crate::memory::AlignedBytes;

pub struct Device {
    faults: Faults,
    threads: usize,
    runs_started: AtomicU64,
}

pub struct Design {
    id: u64,
    device: Arc<Device>,
    pub geometry: Geometry,
    /// For messages: the xclbin's file name.
    pub name: String,
}

pub struct Buffer {
    design: u64,
    group: u32,
    /// What the host sees through the mapping.
    host: AlignedBytes,
    /// What the "device" sees: sync copies between the two, so a forgotten sync shows up here
    /// as stale data, as it can on the real device.
    device: RwLock<AlignedBytes>,
}

pub struct Run {
    state: Mutex<u32>,
    finished: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    devices: HashMap<u64, Arc<Device>>,
    designs: HashMap<u64, Arc<Design>>,
    buffers: HashMap<u64, Arc<Buffer>>,
    runs: HashMap<u64, Arc<Run>>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(Registry::default()));

fn registry() -> MutexGuard<'static, Registry> {
    // A panic while holding the lock leaves only maps behind, which stay consistent.
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Registry {
    fn insert_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

fn lookup<T>(map: &HashMap<u64, Arc<T>>, id: u64, what: &str) -> Result<Arc<T>, EmuError> {
    map.get(&id)
        .cloned()
        .ok_or_else(|| EmuError::invalid(format!("{what} handle {id:#x} is not open")))
}

pub fn open_device(index: u32) -> Result<u64, EmuError> {
    if index != 0 {
        return Err(EmuError::not_found(format!(
            "the software NPU has one device (index 0), not {index}"
        )));
    }
    let device = Device {
        faults: Faults::from_env()?,
        threads: threads_from_env()?,
        runs_started: AtomicU64::new(0),
    };
    let mut reg = registry();
    let id = reg.insert_id();
    reg.devices.insert(id, Arc::new(device));
    Ok(id)
}

pub fn close_device(id: u64) {
    registry().devices.remove(&id);
}

pub fn load_design(
    device: u64,
    geometry: Geometry,
    xclbin: &Path,
    insts: &Path,
    kernel: &str,
) -> Result<u64, EmuError> {
    let device = lookup(&registry().devices, device, "device")?;
    check_design_files(&geometry, xclbin, insts, kernel)?;
    let name = xclbin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut reg = registry();
    let id = reg.insert_id();
    reg.designs.insert(
        id,
        Arc::new(Design {
            id,
            device,
            geometry,
            name,
        }),
    );
    Ok(id)
}

pub fn unload_design(id: u64) {
    registry().designs.remove(&id);
}

pub fn alloc_buffer(design: u64, group: u32, size: u64) -> Result<u64, EmuError> {
    let design = lookup(&registry().designs, design, "design")?;
    let g = design.geometry;
    let expected = g.buffer_len(group).ok_or_else(|| {
        EmuError::invalid(format!(
            "group {group} is not a data group of design {} (3 = A, 4 = B, 5 = C)",
            design.name
        ))
    })?;
    if size != expected as u64 {
        return Err(EmuError::invalid(format!(
            "buffer {} of design {} ({g}) must be {expected} bytes, not {size}",
            group_name(group),
            design.name
        )));
    }
    let alloc = || {
        AlignedBytes::zeroed(expected)
            .ok_or_else(|| EmuError::device(format!("cannot allocate {expected} bytes")))
    };
    let buffer = Buffer {
        design: design.id,
        group,
        host: alloc()?,
        device: RwLock::new(alloc()?),
    };
    let mut reg = registry();
    let id = reg.insert_id();
    reg.buffers.insert(id, Arc::new(buffer));
    Ok(id)
}

pub fn map_buffer(id: u64) -> Result<(*mut u8, u64), EmuError> {
    let buffer = lookup(&registry().buffers, id, "buffer")?;
    // The registry keeps the buffer (and so its memory) alive until xdna_vl_buffer_free.
    Ok((buffer.host.as_mut_ptr(), buffer.host.len() as u64))
}

pub fn sync_buffer(id: u64, direction: u32) -> Result<(), EmuError> {
    let buffer = lookup(&registry().buffers, id, "buffer")?;
    let mut device = buffer.device.write().unwrap_or_else(|p| p.into_inner());
    let len = buffer.host.len();
    let host = buffer.host.as_mut_ptr();
    match direction {
        abi::SYNC_TO_DEVICE => {
            // SAFETY: `host` is the buffer's own allocation of `len` bytes, alive (we hold an
            // Arc); by the ABI's contract the host does not write it during this call.
            let host = unsafe { std::slice::from_raw_parts(host, len) };
            device.as_mut_slice().copy_from_slice(host);
        }
        abi::SYNC_FROM_DEVICE => {
            // SAFETY: as above; by the contract the host neither reads nor writes it now.
            let host = unsafe { std::slice::from_raw_parts_mut(host, len) };
            host.copy_from_slice(device.as_slice());
        }
        other => {
            return Err(EmuError::invalid(format!(
                "sync direction {other} (0 = to device, 1 = from device)"
            )))
        }
    }
    Ok(())
}

pub fn free_buffer(id: u64) {
    registry().buffers.remove(&id);
}

/// Launches a run on the "device" copies of A, B and C.
pub fn start_run(design: u64, a: u64, b: u64, c: u64) -> Result<u64, EmuError> {
    let (design, buffers) = {
        let reg = registry();
        let design = lookup(&reg.designs, design, "design")?;
        let buffers = [
            lookup(&reg.buffers, a, "A buffer")?,
            lookup(&reg.buffers, b, "B buffer")?,
            lookup(&reg.buffers, c, "C buffer")?,
        ];
        (design, buffers)
    };
    for (buffer, group) in buffers
        .iter()
        .zip([abi::GROUP_A, abi::GROUP_B, abi::GROUP_C])
    {
        if buffer.design != design.id {
            return Err(EmuError::invalid(format!(
                "the {} buffer belongs to another design than {}",
                group_name(group),
                design.name
            )));
        }
        if buffer.group != group {
            return Err(EmuError::invalid(format!(
                "a buffer of group {} was passed as {} to design {}",
                group_name(buffer.group),
                group_name(group),
                design.name
            )));
        }
    }
    let run_number = design.device.runs_started.fetch_add(1, Ordering::SeqCst) + 1;
    let run = Arc::new(Run {
        state: Mutex::new(abi::STATE_RUNNING),
        finished: Condvar::new(),
        worker: Mutex::new(None),
    });
    match design.device.faults.for_run(run_number) {
        Some(Fault::Hang) => {}
        Some(Fault::Abort) => run.finish(abi::STATE_ABORT),
        fault => {
            let worker_run = run.clone();
            let threads = design.device.threads;
            let geometry = design.geometry;
            let [a, b, c] = buffers;
            let worker = std::thread::Builder::new()
                .name("npu-emu-run".into())
                .spawn(move || {
                    let state = if fault == Some(Fault::Fail) {
                        c.device
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .as_mut_slice()
                            .fill(0xA5);
                        abi::STATE_ERROR
                    } else {
                        let computed =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                let a = a.device.read().unwrap_or_else(|p| p.into_inner());
                                let b = b.device.read().unwrap_or_else(|p| p.into_inner());
                                let mut c = c.device.write().unwrap_or_else(|p| p.into_inner());
                                compute::gemm(
                                    &geometry,
                                    a.as_slice(),
                                    b.as_slice(),
                                    c.as_mut_slice(),
                                    threads,
                                );
                            }));
                        if computed.is_ok() {
                            abi::STATE_COMPLETED
                        } else {
                            abi::STATE_ERROR
                        }
                    };
                    worker_run.finish(state);
                })
                .map_err(|e| EmuError::device(format!("cannot start a run thread: {e}")))?;
            *run.worker.lock().unwrap_or_else(|p| p.into_inner()) = Some(worker);
        }
    }
    let mut reg = registry();
    let id = reg.insert_id();
    reg.runs.insert(id, run);
    Ok(id)
}

impl Run {
    fn finish(&self, state: u32) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
        self.finished.notify_all();
    }
}

/// The run's state after waiting at most `timeout`: TIMEOUT if it is still running.
pub fn wait_run(id: u64, timeout: Duration) -> Result<u32, EmuError> {
    let run = lookup(&registry().runs, id, "run")?;
    let state = run.state.lock().unwrap_or_else(|p| p.into_inner());
    let (state, _) = run
        .finished
        .wait_timeout_while(state, timeout, |s| *s == abi::STATE_RUNNING)
        .unwrap_or_else(|p| p.into_inner());
    Ok(if *state == abi::STATE_RUNNING {
        abi::STATE_TIMEOUT
    } else {
        *state
    })
}

/// Frees a run, first waiting for its computation if it has one (a hung run has none).
pub fn free_run(id: u64) {
    let Some(run) = registry().runs.remove(&id) else {
        return;
    };
    let worker = run.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(worker) = worker {
        let _ = worker.join();
    }
}
