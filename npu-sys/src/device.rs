//! Safe owners of the runtime's handles: a device, the designs loaded into it, their buffers and
//! runs. Every handle is freed by Drop, children before parents (each child keeps its parent alive).

use std::ffi::{c_void, CString};
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::Duration;

use crate::abi;
use crate::designs::DesignEntry;
use crate::detect::{self, DetectError};
use crate::geometry::{ArgGroup, Geometry, GeometryError};
use crate::runtime::{CallError, Runtime, RuntimeInner};

/// What the runtime says about the device it opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub firmware: String,
    pub columns: u32,
    /// A software NPU.
    pub software: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Detect(#[from] DetectError),
    #[error("opening NPU device {index}: {source}")]
    Open { index: u32, source: CallError },
    #[error("loading design {design} ({geometry}): {message}")]
    Load {
        design: String,
        geometry: Geometry,
        message: String,
    },
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    #[error("design {design} ({geometry}), buffer {group}: {source}")]
    Buffer {
        design: String,
        geometry: Geometry,
        group: ArgGroup,
        source: CallError,
    },
}

/// The final state of a run: the values of XRT's `ert_cmd_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErtState {
    New,
    Queued,
    Running,
    Completed,
    Error,
    Abort,
    Submitted,
    Timeout,
    NoResponse,
    Unknown(u32),
}

impl ErtState {
    pub fn from_abi(value: u32) -> ErtState {
        match value {
            abi::STATE_NEW => ErtState::New,
            abi::STATE_QUEUED => ErtState::Queued,
            abi::STATE_RUNNING => ErtState::Running,
            abi::STATE_COMPLETED => ErtState::Completed,
            abi::STATE_ERROR => ErtState::Error,
            abi::STATE_ABORT => ErtState::Abort,
            abi::STATE_SUBMITTED => ErtState::Submitted,
            abi::STATE_TIMEOUT => ErtState::Timeout,
            abi::STATE_NORESPONSE => ErtState::NoResponse,
            other => ErtState::Unknown(other),
        }
    }
}

impl fmt::Display for ErtState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErtState::New => f.write_str("NEW"),
            ErtState::Queued => f.write_str("QUEUED"),
            ErtState::Running => f.write_str("RUNNING"),
            ErtState::Completed => f.write_str("COMPLETED"),
            ErtState::Error => f.write_str("ERROR"),
            ErtState::Abort => f.write_str("ABORT"),
            ErtState::Submitted => f.write_str("SUBMITTED"),
            ErtState::Timeout => f.write_str("TIMEOUT"),
            ErtState::NoResponse => f.write_str("NORESPONSE"),
            ErtState::Unknown(value) => write!(f, "unknown state {value}"),
        }
    }
}

/// A run that did not complete: names the design, its geometry and what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("design {design} ({geometry}): run refused: {message}")]
    Refused {
        design: String,
        geometry: Geometry,
        message: String,
    },
    #[error("design {design} ({geometry}): run ended in state {state} (waited up to {} ms)", .timeout.as_millis())]
    Failed {
        design: String,
        geometry: Geometry,
        state: ErtState,
        timeout: Duration,
    },
    #[error("design {design} ({geometry}): syncing C from the device: {source}")]
    Sync {
        design: String,
        geometry: Geometry,
        source: CallError,
    },
}

impl RunError {
    /// The final state, when the run was launched.
    pub fn state(&self) -> Option<ErtState> {
        match self {
            RunError::Failed { state, .. } => Some(*state),
            _ => None,
        }
    }
}

/// An open NPU (or software NPU). Designs loaded from it keep it open.
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    runtime: Arc<RuntimeInner>,
    handle: NonNull<abi::DeviceHandle>,
    info: DeviceInfo,
}

// SAFETY: the ABI declares every call thread-safe except concurrent calls on one buffer or one
// run; a device handle is only passed to design_load (thread-safe) and to close in Drop.
unsafe impl Send for DeviceInner {}
// SAFETY: as above; shared references only load designs.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: the handle came from device_open of this runtime and is closed exactly once;
        // every design holds an Arc to this, so none is alive any more.
        unsafe { (self.runtime.fns.device_close)(self.handle.as_ptr()) }
    }
}

fn c_text(bytes: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = bytes
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Device {
    /// Opens the first NPU. With a hardware runtime, refuses first when no `amdxdna` device
    /// node exists; a software runtime needs none.
    pub fn open(runtime: &Runtime) -> Result<Device, DeviceError> {
        Device::open_index(runtime, 0)
    }

    pub fn open_index(runtime: &Runtime, index: u32) -> Result<Device, DeviceError> {
        if !runtime.is_software() {
            detect::find_npus()?;
        }
        let rt = &runtime.inner;
        let mut handle = ptr::null_mut();
        let mut raw_info = abi::DeviceInfo::zeroed();
        // SAFETY: device_open has the ABI's signature; both out-pointers point to live locals.
        let code = unsafe { (rt.fns.device_open)(index, &mut handle, &mut raw_info) };
        rt.check("xdna_vl_device_open", code)
            .map_err(|source| DeviceError::Open { index, source })?;
        let Some(handle) = NonNull::new(handle) else {
            return Err(DeviceError::Open {
                index,
                source: CallError {
                    call: "xdna_vl_device_open",
                    code: 0,
                    message: "returned success but no handle".into(),
                },
            });
        };
        let info = DeviceInfo {
            name: c_text(&raw_info.name),
            firmware: c_text(&raw_info.firmware),
            columns: raw_info.columns,
            software: raw_info.software != 0,
        };
        Ok(Device {
            inner: Arc::new(DeviceInner {
                runtime: rt.clone(),
                handle,
                info,
            }),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// Loads a design into a hardware context on this device.
    pub fn load_design(&self, entry: &DesignEntry) -> Result<Design, DeviceError> {
        let refuse = |message: String| DeviceError::Load {
            design: entry.name.clone(),
            geometry: entry.geometry,
            message,
        };
        entry.geometry.validate()?;
        let as_u32 = |v: usize, what: &str| {
            u32::try_from(v).map_err(|_| refuse(format!("{what} = {v} does not fit the ABI's u32")))
        };
        let desc_kind = entry.geometry.kind.abi_value();
        let m_tile = as_u32(entry.geometry.m_tile, "m_tile")?;
        let k = as_u32(entry.geometry.k, "k")?;
        let n = as_u32(entry.geometry.n, "n")?;
        let xclbin = path_cstring(&entry.xclbin).map_err(&refuse)?;
        let insts = path_cstring(&entry.insts).map_err(&refuse)?;
        let kernel = CString::new(entry.kernel.as_bytes()).map_err(|_| {
            refuse(format!(
                "kernel name {:?} contains a NUL byte",
                entry.kernel
            ))
        })?;
        let desc = abi::DesignDesc {
            xclbin_path: xclbin.as_ptr(),
            insts_path: insts.as_ptr(),
            kernel_name: kernel.as_ptr(),
            kind: desc_kind,
            m_tile,
            k,
            n,
        };
        let rt = &self.inner.runtime;
        let mut handle = ptr::null_mut();
        // SAFETY: design_load has the ABI's signature; the device handle is live (we hold its
        // owner), `desc` and the strings it points to outlive the call, `handle` is a live local.
        let code = unsafe { (rt.fns.design_load)(self.inner.handle.as_ptr(), &desc, &mut handle) };
        rt.check("xdna_vl_design_load", code)
            .map_err(|e| refuse(e.message))?;
        let handle = NonNull::new(handle)
            .ok_or_else(|| refuse("runtime returned no design handle".into()))?;
        Ok(Design {
            inner: Arc::new(DesignInner {
                device: self.inner.clone(),
                handle,
                name: entry.name.clone(),
                geometry: entry.geometry,
            }),
        })
    }
}

fn path_cstring(path: &Path) -> Result<CString, String> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path.to_string_lossy().into_owned().into_bytes();
    CString::new(bytes).map_err(|_| format!("path {} contains a NUL byte", path.display()))
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("info", &self.inner.info)
            .finish()
    }
}

/// A design loaded into a hardware context: a kernel of a fixed geometry.
pub struct Design {
    inner: Arc<DesignInner>,
}

struct DesignInner {
    device: Arc<DeviceInner>,
    handle: NonNull<abi::DesignHandle>,
    name: String,
    geometry: Geometry,
}

// SAFETY: see DeviceInner; a design handle is used by buffer_alloc and run_start, both
// thread-safe by the ABI's contract.
unsafe impl Send for DesignInner {}
// SAFETY: as above.
unsafe impl Sync for DesignInner {}

impl Drop for DesignInner {
    fn drop(&mut self) {
        // SAFETY: the handle came from design_load and is unloaded once; buffers and runs hold an
        // Arc to this, so none is alive any more; the device is (we hold its Arc).
        unsafe { (self.device.runtime.fns.design_unload)(self.handle.as_ptr()) }
    }
}

impl Design {
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    fn runtime(&self) -> &RuntimeInner {
        &self.inner.device.runtime
    }

    /// A zeroed buffer of `group`, sized by the geometry.
    pub fn alloc(&self, group: ArgGroup) -> Result<Buffer, DeviceError> {
        self.alloc_sized(group, self.inner.geometry.buffer_len(group))
    }

    /// A buffer of `group` with an explicit size. The runtime refuses a size that is not the
    /// geometry's; this exists so that refusal can be shown.
    pub fn alloc_sized(&self, group: ArgGroup, len: usize) -> Result<Buffer, DeviceError> {
        let buffer_error = |source: CallError| DeviceError::Buffer {
            design: self.inner.name.clone(),
            geometry: self.inner.geometry,
            group,
            source,
        };
        let rt = self.runtime();
        let mut handle = ptr::null_mut();
        // SAFETY: buffer_alloc has the ABI's signature; the design handle is live; `handle` is a
        // live local.
        let code = unsafe {
            (rt.fns.buffer_alloc)(
                self.inner.handle.as_ptr(),
                group.abi_value(),
                len as u64,
                &mut handle,
            )
        };
        rt.check("xdna_vl_buffer_alloc", code)
            .map_err(buffer_error)?;
        let Some(handle) = NonNull::new(handle) else {
            return Err(buffer_error(CallError {
                call: "xdna_vl_buffer_alloc",
                code: 0,
                message: "returned success but no handle".into(),
            }));
        };
        // Own the handle before anything else can fail, so Drop frees it.
        let mut buffer = Buffer {
            design: self.inner.clone(),
            handle,
            group,
            data: NonNull::dangling(),
            len: 0,
        };
        let mut data: *mut c_void = ptr::null_mut();
        let mut size: u64 = 0;
        // SAFETY: buffer_map has the ABI's signature; the buffer handle is live; the
        // out-pointers are live locals.
        let code = unsafe { (rt.fns.buffer_map)(handle.as_ptr(), &mut data, &mut size) };
        rt.check("xdna_vl_buffer_map", code).map_err(buffer_error)?;
        let data = NonNull::new(data.cast::<u8>()).ok_or_else(|| {
            buffer_error(CallError {
                call: "xdna_vl_buffer_map",
                code: 0,
                message: "returned a NULL mapping".into(),
            })
        })?;
        if size != len as u64 {
            return Err(buffer_error(CallError {
                call: "xdna_vl_buffer_map",
                code: 0,
                message: format!("mapped {size} bytes, allocated {len}"),
            }));
        }
        buffer.data = data;
        buffer.len = len;
        Ok(buffer)
    }

    fn refused(&self, message: String) -> RunError {
        RunError::Refused {
            design: self.inner.name.clone(),
            geometry: self.inner.geometry,
            message,
        }
    }

    /// Launches the design on (A, B, C). The run borrows the buffers until it is waited for:
    /// A and B shared (the device reads them), C exclusively (the device writes it).
    pub fn start<'a>(
        &'a self,
        a: &'a Buffer,
        b: &'a Buffer,
        c: &'a mut Buffer,
    ) -> Result<Run<'a>, RunError> {
        for (buffer, group) in [(a, ArgGroup::A), (b, ArgGroup::B), (&*c, ArgGroup::C)] {
            if !Arc::ptr_eq(&buffer.design, &self.inner) {
                return Err(self.refused(format!(
                    "buffer passed as {group} belongs to design {} ({})",
                    buffer.design.name, buffer.design.geometry
                )));
            }
            if buffer.group != group {
                return Err(self.refused(format!(
                    "buffer of group {} passed as {group}",
                    buffer.group
                )));
            }
        }
        let rt = self.runtime();
        let mut handle = ptr::null_mut();
        // SAFETY: run_start has the ABI's signature; the design and buffer handles are live and
        // belong together (checked above); the returned run borrows all three buffers so the host
        // cannot touch C or free any of them while the device may use them.
        let code = unsafe {
            (rt.fns.run_start)(
                self.inner.handle.as_ptr(),
                a.handle.as_ptr(),
                b.handle.as_ptr(),
                c.handle.as_ptr(),
                &mut handle,
            )
        };
        rt.check("xdna_vl_run_start", code)
            .map_err(|e| self.refused(e.message))?;
        let handle = NonNull::new(handle)
            .ok_or_else(|| self.refused("runtime returned no run handle".into()))?;
        Ok(Run {
            design: self,
            handle,
            c: Some(c),
            _inputs: PhantomData,
        })
    }

    /// Launches, waits at most `timeout`, and syncs C back from the device.
    pub fn run(
        &self,
        a: &Buffer,
        b: &Buffer,
        c: &mut Buffer,
        timeout: Duration,
    ) -> Result<(), RunError> {
        self.start(a, b, c)?.wait(timeout)?;
        Ok(())
    }
}

impl fmt::Debug for Design {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Design")
            .field("name", &self.inner.name)
            .field("geometry", &self.inner.geometry)
            .finish()
    }
}

/// A launched run. Dropping it without waiting frees it (the runtime waits for, or abandons, it).
pub struct Run<'a> {
    design: &'a Design,
    handle: NonNull<abi::RunHandle>,
    /// Some until `wait` hands it back.
    c: Option<&'a mut Buffer>,
    _inputs: PhantomData<(&'a Buffer, &'a Buffer)>,
}

impl<'a> Run<'a> {
    /// Waits at most `timeout`. On completion syncs C from the device and hands it back; any
    /// other final state is an error naming the design, its geometry and the state.
    pub fn wait(mut self, timeout: Duration) -> Result<&'a mut Buffer, RunError> {
        let design = self.design;
        let rt = design.runtime();
        let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        let mut raw_state = 0u32;
        // SAFETY: run_wait has the ABI's signature; the run handle is live until Drop below;
        // `raw_state` is a live local.
        let code = unsafe { (rt.fns.run_wait)(self.handle.as_ptr(), timeout_ms, &mut raw_state) };
        rt.check("xdna_vl_run_wait", code)
            .map_err(|e| design.refused(e.message))?;
        let state = ErtState::from_abi(raw_state);
        if state != ErtState::Completed {
            return Err(RunError::Failed {
                design: design.inner.name.clone(),
                geometry: design.inner.geometry,
                state,
                timeout,
            });
        }
        // Free the run before C is touched again; the borrow of C outlives it.
        let c = self.c.take();
        drop(self);
        let Some(c) = c else {
            return Err(design.refused("the run's C buffer was already handed back".into()));
        };
        c.sync_from_device().map_err(|source| RunError::Sync {
            design: design.inner.name.clone(),
            geometry: design.inner.geometry,
            source,
        })?;
        Ok(c)
    }
}

fn free_run(design: &Design, handle: NonNull<abi::RunHandle>) {
    // SAFETY: the handle came from run_start and is freed exactly once, by Run's Drop.
    unsafe { (design.runtime().fns.run_free)(handle.as_ptr()) }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        free_run(self.design, self.handle);
    }
}

/// A buffer bound to one argument group of a design, mapped into host memory.
pub struct Buffer {
    design: Arc<DesignInner>,
    handle: NonNull<abi::BufferHandle>,
    group: ArgGroup,
    data: NonNull<u8>,
    len: usize,
}

// SAFETY: every call on the handle takes &mut self (sync) or happens in Drop, so calls on one
// buffer are never concurrent; the mapping is plain host memory.
unsafe impl Send for Buffer {}
// SAFETY: shared references only read the mapping (as_slice); writes need &mut.
unsafe impl Sync for Buffer {}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the handle came from buffer_alloc and is freed once; no run borrows this buffer
        // (a run holds a borrow of it); the design is alive (we hold its Arc).
        unsafe { (self.design.device.runtime.fns.buffer_free)(self.handle.as_ptr()) }
    }
}

impl Buffer {
    pub fn group(&self) -> ArgGroup {
        self.group
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host view of the buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: buffer_map returned `data` valid for `len` bytes until buffer_free (Drop); the
        // device writes only C, and only while a run holds the exclusive borrow of it.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; &mut self excludes every other view and any run on it.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr(), self.len) }
    }

    fn sync(&mut self, direction: u32, call: &'static str) -> Result<(), CallError> {
        let rt = &self.design.device.runtime;
        // SAFETY: buffer_sync has the ABI's signature; the handle is live; &mut self makes this
        // the only call on it.
        let code = unsafe { (rt.fns.buffer_sync)(self.handle.as_ptr(), direction) };
        rt.check(call, code)
    }

    /// Makes the host's writes visible to the device.
    pub fn sync_to_device(&mut self) -> Result<(), CallError> {
        self.sync(abi::SYNC_TO_DEVICE, "xdna_vl_buffer_sync(to device)")
    }

    /// Makes the device's writes visible to the host.
    pub fn sync_from_device(&mut self) -> Result<(), CallError> {
        self.sync(abi::SYNC_FROM_DEVICE, "xdna_vl_buffer_sync(from device)")
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("design", &self.design.name)
            .field("group", &self.group)
            .field("len", &self.len)
            .finish()
    }
}
