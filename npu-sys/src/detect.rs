//! Finding a Ryzen AI NPU before opening anything: `/dev/accel/accel*` nodes whose driver is
//! `amdxdna` (other vendors' NPUs share `/dev/accel`, so the driver is checked, not just the node).

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// The kernel driver of the Ryzen AI NPU.
pub const NPU_DRIVER: &str = "amdxdna";

/// One `/dev/accel/accelN` node and what sysfs says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccelNode {
    /// `/dev/accel/accelN`.
    pub node: PathBuf,
    /// The bound driver's name (`amdxdna`, `ivpu`, ...), or None when sysfs does not say.
    pub driver: Option<String>,
    /// The PCI address (`0000:c6:00.1`) when the device is a PCI device.
    pub pci_address: Option<String>,
    /// PCI vendor and device ids.
    pub pci_id: Option<(u16, u16)>,
}

impl AccelNode {
    pub fn is_npu(&self) -> bool {
        self.driver.as_deref() == Some(NPU_DRIVER)
    }

    /// The design target of this NPU, from its PCI id, when known.
    pub fn target(&self) -> Option<crate::tiling::NpuTarget> {
        match self.pci_id {
            Some((0x1022, 0x1502)) => Some(crate::tiling::NpuTarget::Npu1),
            Some((0x1022, 0x17f0)) => Some(crate::tiling::NpuTarget::Npu2),
            _ => None,
        }
    }

    /// XDNA generation from the PCI id, when known.
    pub fn generation(&self) -> Option<&'static str> {
        match self.pci_id {
            Some((0x1022, 0x1502)) => Some("XDNA1 (Phoenix/Hawk Point)"),
            Some((0x1022, 0x17f0)) => Some("XDNA2 (Strix/Krackan/Strix Halo)"),
            _ => None,
        }
    }
}

impl fmt::Display for AccelNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.node.display())?;
        match &self.driver {
            Some(driver) => write!(f, " (driver {driver}")?,
            None => write!(f, " (driver unknown")?,
        }
        if let Some(address) = &self.pci_address {
            write!(f, ", PCI {address}")?;
        }
        if let Some((vendor, device)) = self.pci_id {
            write!(f, ", {vendor:04x}:{device:04x}")?;
        }
        if let Some(generation) = self.generation() {
            write!(f, ", {generation}")?;
        }
        write!(f, ")")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("the Ryzen AI NPU needs Linux (driver amdxdna); this is {0}")]
    NotLinux(&'static str),
    #[error(
        "no NPU: {dir} does not exist (no accelerator driver loaded; the NPU needs the amdxdna \
         driver, in Linux since 6.14, or amd/xdna-driver for older kernels)"
    )]
    NoAccelDir { dir: PathBuf },
    #[error("no NPU: {dir} has no accel* node")]
    NoNodes { dir: PathBuf },
    #[error("no NPU bound to {NPU_DRIVER}: {}", display_nodes(.nodes))]
    NoNpu { nodes: Vec<AccelNode> },
    #[error("cannot read {path}: {message}")]
    Io { path: PathBuf, message: String },
}

fn display_nodes(nodes: &[AccelNode]) -> String {
    nodes
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The NPU nodes of this machine, or why there are none.
pub fn find_npus() -> Result<Vec<AccelNode>, DetectError> {
    if !cfg!(target_os = "linux") {
        return Err(DetectError::NotLinux(std::env::consts::OS));
    }
    find_npus_in(Path::new("/dev/accel"), Path::new("/sys/class/accel"))
}

/// [`find_npus`] over given roots (tests use a fake tree).
pub fn find_npus_in(dev_dir: &Path, sys_class: &Path) -> Result<Vec<AccelNode>, DetectError> {
    let nodes = scan_accel(dev_dir, sys_class)?;
    if nodes.is_empty() {
        return Err(DetectError::NoNodes {
            dir: dev_dir.to_path_buf(),
        });
    }
    let npus: Vec<AccelNode> = nodes.iter().filter(|n| n.is_npu()).cloned().collect();
    if npus.is_empty() {
        return Err(DetectError::NoNpu { nodes });
    }
    Ok(npus)
}

/// Every `accel*` node under `dev_dir`, sorted by name, with sysfs facts from `sys_class`.
pub fn scan_accel(dev_dir: &Path, sys_class: &Path) -> Result<Vec<AccelNode>, DetectError> {
    let entries = match fs::read_dir(dev_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(DetectError::NoAccelDir {
                dir: dev_dir.to_path_buf(),
            })
        }
        Err(e) => {
            return Err(DetectError::Io {
                path: dev_dir.to_path_buf(),
                message: e.to_string(),
            })
        }
    };
    let mut nodes = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("accel") {
            continue;
        }
        let device = sys_class.join(&name).join("device");
        let driver = fs::read_link(device.join("driver"))
            .ok()
            .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()));
        let pci_address = fs::read_link(&device)
            .ok()
            .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()));
        let pci_id = read_hex(&device.join("vendor")).zip(read_hex(&device.join("device")));
        nodes.push(AccelNode {
            node: entry.path(),
            driver,
            pci_address,
            pci_id,
        });
    }
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(nodes)
}

fn read_hex(path: &Path) -> Option<u16> {
    let text = fs::read_to_string(path).ok()?;
    u16::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_node(root: &Path, name: &str, driver: &str, vendor: &str, device: &str) {
        let dev = root.join("dev");
        fs::create_dir_all(&dev).unwrap();
        fs::write(dev.join(name), b"").unwrap();
        let pci = root.join("pci").join(format!("0000:c6:00.{}", &name[5..]));
        fs::create_dir_all(&pci).unwrap();
        fs::write(pci.join("vendor"), vendor).unwrap();
        fs::write(pci.join("device"), device).unwrap();
        let drivers = root.join("drivers").join(driver);
        fs::create_dir_all(&drivers).unwrap();
        std::os::unix::fs::symlink(&drivers, pci.join("driver")).unwrap();
        let class = root.join("class").join(name);
        fs::create_dir_all(&class).unwrap();
        std::os::unix::fs::symlink(&pci, class.join("device")).unwrap();
    }

    #[test]
    fn picks_the_amdxdna_node_and_skips_other_vendors() {
        let root = tempfile::tempdir().unwrap();
        fake_node(root.path(), "accel0", "ivpu", "0x8086\n", "0x7d1d\n");
        fake_node(root.path(), "accel1", "amdxdna", "0x1022\n", "0x17f0\n");
        let npus = find_npus_in(&root.path().join("dev"), &root.path().join("class")).unwrap();
        assert_eq!(npus.len(), 1);
        assert_eq!(npus[0].node, root.path().join("dev/accel1"));
        assert_eq!(npus[0].pci_id, Some((0x1022, 0x17f0)));
        assert_eq!(npus[0].pci_address.as_deref(), Some("0000:c6:00.1"));
        assert!(npus[0].generation().unwrap().starts_with("XDNA2"));
    }

    #[test]
    fn a_node_of_another_driver_is_not_an_npu() {
        let root = tempfile::tempdir().unwrap();
        fake_node(root.path(), "accel0", "ivpu", "0x8086\n", "0x7d1d\n");
        let err = find_npus_in(&root.path().join("dev"), &root.path().join("class")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("no NPU bound to amdxdna"), "{text}");
        assert!(text.contains("driver ivpu"), "{text}");
    }

    #[test]
    fn no_accel_dir_says_which_driver_is_needed() {
        let root = tempfile::tempdir().unwrap();
        let err = find_npus_in(&root.path().join("none"), &root.path().join("class")).unwrap_err();
        assert!(matches!(err, DetectError::NoAccelDir { .. }));
        assert!(err.to_string().contains("amdxdna"));
    }
}
