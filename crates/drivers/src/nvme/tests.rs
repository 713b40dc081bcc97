//! What can be checked without an NVMe device: properties before connect and the connect
//! errors of paths that are not namespaces. The I/O path is tested in a VM with emulated NVMe
//! controllers (tests/suites/nvme-vm.sh).

use super::NvmeDriver;
use snapblk_core::Blkio;

fn blkio() -> Blkio {
    Blkio::new(Box::new(NvmeDriver::new()))
}

#[test]
fn created_state_properties_are_libblkios() {
    let b = blkio();
    assert_eq!(b.get_str("driver").unwrap(), "nvme-io_uring");
    assert_eq!(b.get_str("path").unwrap(), "");
    assert_eq!(b.get_int("fd").unwrap(), -1);
    assert_eq!(b.get_int("num-entries").unwrap(), 128);
    assert_eq!(b.get_int("max-queues").unwrap(), i32::MAX);
    assert_eq!(b.get_u64("max-mem-regions").unwrap(), u64::MAX);
    assert!(b.get_bool("flush-needed").unwrap());
    assert!(!b.get_bool("supports-poll-queues").unwrap());
    assert!(b.get_bool("can-add-queues").unwrap());
    for p in [
        "capacity",
        "request-alignment",
        "max-transfer",
        "max-discard-len",
    ] {
        assert_eq!(b.get_str(p).unwrap_err().errno, libc::ENODEV, "{p}");
    }
    // The zone properties read as "not zoned" until connect, with libblkio's types.
    assert_eq!(b.get_int("zoned").unwrap(), 0);
    assert_eq!(b.get_u64("zone-size").unwrap(), 0);
    assert_eq!(b.get_u64("nr-zones").unwrap(), 0);
    assert_eq!(b.get_int("max-open-zones").unwrap(), 0);
    assert_eq!(b.get_int("max-active-zones").unwrap(), 0);
    assert!(!b.get_bool("append-support").unwrap());
    assert_eq!(b.get_u64("zone-append-max-bytes").unwrap(), 0);
    assert_eq!(b.get_u64("zoned").unwrap_err().errno, libc::ENOTTY);
}

#[test]
fn num_entries_is_set_when_connected_only() {
    let mut b = blkio();
    let e = b.set_int("num-entries", 64).unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (libc::ENODEV, "Device must be connected")
    );
    let e = b.set_int("zoned", 1).unwrap_err();
    assert_eq!(e.errno, libc::EACCES);
}

fn connect_err(path: &str) -> (i32, String) {
    let mut b = blkio();
    if !path.is_empty() {
        b.set_str("path", path).unwrap();
    }
    let e = b.connect().unwrap_err();
    (e.errno, e.msg.into_owned())
}

#[test]
fn connect_refuses_what_is_not_a_namespace() {
    assert_eq!(
        connect_err(""),
        (libc::EINVAL, "One of path and fd must be set".into())
    );
    let dir = std::env::temp_dir().join(format!("snapblk-nvme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("img");
    std::fs::write(&file, vec![0u8; 4096]).unwrap();
    for p in [dir.display().to_string(), file.display().to_string()] {
        assert_eq!(
            connect_err(&p),
            (libc::EINVAL, "The file must be a character device".into()),
            "{p}"
        );
    }
    let missing = dir.join("nope").display().to_string();
    let (errno, msg) = connect_err(&missing);
    assert_eq!(errno, libc::ENOENT);
    assert!(msg.starts_with(&format!("opening {missing}: ")), "{msg}");
    // A character device that is no NVMe namespace: the ioctl is refused.
    let (errno, msg) = connect_err("/dev/null");
    assert_eq!(errno, libc::ENOTTY, "{msg}");
    assert!(
        msg.starts_with("not an NVMe namespace character device"),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn connect_through_fd_checks_the_same() {
    let f = std::fs::File::open("/dev/null").unwrap();
    let mut b = blkio();
    use std::os::fd::AsRawFd;
    b.set_int("fd", f.as_raw_fd()).unwrap();
    assert_eq!(b.connect().unwrap_err().errno, libc::ENOTTY);
    let mut b = blkio();
    b.set_int("fd", 1 << 20).unwrap();
    let e = b.connect().unwrap_err();
    assert_eq!(e.errno, libc::EBADF);
    assert!(e.msg.starts_with("opening fd 1048576: "), "{}", e.msg);
    // The failed connects leave the instance in the created state.
    assert_eq!(b.state(), snapblk_core::State::Created);
}

#[test]
fn command_set_without_cap_sys_admin_asks_the_zns_structure() {
    use super::command_set;
    use super::id::{CSI_NVM, CSI_ZNS, NvmeError};
    let denied = |e| {
        Err(NvmeError::Identify {
            cns: 3,
            source: std::io::Error::from_raw_os_error(e),
        })
    };
    let status = |cns| Err(NvmeError::IdentifyStatus { cns, status: 2 });
    // A ZNS namespace structure with a zone size for LBA format 1.
    let mut zns = vec![0u8; 4096];
    zns[2832..2840].copy_from_slice(&8192u64.to_le_bytes());
    for e in [libc::EACCES, libc::EPERM] {
        let z = zns.clone();
        assert_eq!(command_set(denied(e), 1, || Ok(z)).unwrap(), CSI_ZNS);
        // Format 0 has no zone size: not zoned.
        let z = zns.clone();
        assert_eq!(command_set(denied(e), 0, || Ok(z)).unwrap(), CSI_NVM);
        assert_eq!(command_set(denied(e), 1, || status(5)).unwrap(), CSI_NVM);
    }
    // An NVMe status for CNS 3 (no descriptor list): NVM, without asking CNS 5.
    assert_eq!(
        command_set(status(3), 1, || panic!("CNS 5 asked")).unwrap(),
        CSI_NVM
    );
    // Any other system error is an error, not "NVM".
    let e = command_set(denied(libc::EIO), 1, || panic!("CNS 5 asked")).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    let e = command_set(denied(libc::EACCES), 1, || denied(libc::ENODEV)).unwrap_err();
    assert_eq!(e.errno(), libc::ENODEV);
    // The descriptor list, when the controller answers.
    let mut d = vec![0u8; 4096];
    d[..5].copy_from_slice(&[4, 1, 0, 0, 2]);
    assert_eq!(
        command_set(Ok(d), 0, || panic!("CNS 5 asked")).unwrap(),
        CSI_ZNS
    );
}

#[test]
fn kernel_max_transfer_reads_the_block_devices_limit() {
    use super::kernel_max_transfer_of;
    let d = snapblk_testsupport::TempDir::new("nvme-sysfs");
    let sys = d.path();
    std::fs::create_dir_all(sys.join("dev/char")).unwrap();
    std::fs::create_dir_all(sys.join("block/nvme2n3/queue")).unwrap();
    std::os::unix::fs::symlink(
        "../../devices/pci0000:00/0000:00:04.0/nvme/nvme2/ng2n3",
        sys.join("dev/char/240:5"),
    )
    .unwrap();
    std::fs::write(sys.join("block/nvme2n3/queue/max_hw_sectors_kb"), "128\n").unwrap();
    let rdev = libc::makedev(240, 5);
    assert_eq!(kernel_max_transfer_of(sys, rdev), Some(128 * 1024));
    // No block device, or an unknown device number: no limit from the kernel.
    assert_eq!(kernel_max_transfer_of(sys, libc::makedev(240, 6)), None);
    std::fs::remove_file(sys.join("block/nvme2n3/queue/max_hw_sectors_kb")).unwrap();
    assert_eq!(kernel_max_transfer_of(sys, rdev), None);
}

#[test]
fn path_and_fd_together_are_refused() {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open("/dev/null").unwrap();
    let mut b = blkio();
    b.set_str("path", "/dev/null").unwrap();
    b.set_int("fd", f.as_raw_fd()).unwrap();
    let e = b.connect().unwrap_err();
    assert_eq!(
        (e.errno, e.msg.as_ref()),
        (libc::EINVAL, "path and fd cannot be set at the same time")
    );
}
