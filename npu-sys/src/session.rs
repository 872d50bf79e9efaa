//! Opening the NPU the way every program of this project should: the runtime, then (for real
//! hardware) the device-hold ticket, then the device; closed in the reverse order.

use std::path::Path;

use crate::device::Device;
use crate::hold::{Hold, HoldOptions};
use crate::runtime::Runtime;
use crate::Error;

/// An open device with, on real hardware, the lease that makes it ours.
pub struct NpuSession {
    // Field order is drop order: the device closes before the lease is released.
    device: Device,
    runtime: Runtime,
    hold: Option<Hold>,
}

impl NpuSession {
    /// Opens the runtime (`runtime`, else `XDNA_VL_RUNTIME`, else the installed shim). A hardware
    /// runtime takes the device-hold ticket first (waiting in FIFO order, printing who holds it)
    /// and refuses when no amdxdna device exists; the software NPU needs neither.
    pub fn open(runtime: Option<&Path>, program: &str, purpose: &str) -> Result<NpuSession, Error> {
        let runtime = Runtime::open(runtime)?;
        let hold = if runtime.is_software() {
            None
        } else {
            Some(Hold::acquire(&HoldOptions::new(program, purpose))?)
        };
        let device = Device::open(&runtime)?;
        Ok(NpuSession {
            device,
            runtime,
            hold,
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The lease, when the runtime is real hardware.
    pub fn hold(&self) -> Option<&Hold> {
        self.hold.as_ref()
    }
}
