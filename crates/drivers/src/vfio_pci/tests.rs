use super::pci::PciError;
use super::*;
use snapblk_core::Blkio;
use snapblk_testsupport::errors::assert_cause_is_source;
use std::io;

fn blkio() -> Blkio {
    Blkio::new(Box::new(VfioPciDriver::new()))
}

#[test]
fn created_state_properties_are_libblkio_s() {
    let mut b = blkio();
    assert_eq!(b.get_str("driver").unwrap(), NAME);
    assert_eq!(b.get_str("path").unwrap(), "");
    assert_eq!(b.get_int("fd").unwrap(), -1);
    assert_eq!(b.get_int("queue-size").unwrap(), 256);
    assert_eq!(b.get_int("max-queue-size").unwrap(), 32768);
    assert_eq!(b.get_u64("mem-region-alignment").unwrap(), 1);
    assert!(b.get_bool("needs-mem-region-fd").unwrap());
    for p in ["capacity", "max-queues", "max-mem-regions"] {
        let e = match p {
            "max-queues" => b.get_int(p).unwrap_err(),
            _ => b.get_u64(p).unwrap_err(),
        };
        assert_eq!(
            (e.errno, &*e.msg),
            (libc::ENODEV, "Device must be connected"),
            "{p}"
        );
    }
    let e = b.set_int("queue-size", 128).unwrap_err();
    assert_eq!(e.errno, libc::ENODEV);
}

#[test]
fn fd_is_refused_and_path_is_required() {
    let mut b = blkio();
    let e = b.connect().unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (libc::EINVAL, "One of path and fd must be set")
    );
    let e = b.set_int("fd", 3).unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (libc::ENOENT, "fd property not supported")
    );
    assert_eq!(b.get_int("fd").unwrap(), -1);
}

#[test]
fn a_path_that_is_no_pci_device_is_refused() {
    let dir = std::env::temp_dir();
    for (path, errno) in [
        (dir.to_string_lossy().into_owned(), libc::ENOENT),
        ("/nonexistent/snapblk-vfio".to_string(), libc::ENOENT),
        ("/dev/null".to_string(), libc::ENOTDIR),
    ] {
        let mut b = blkio();
        b.set_str("path", &path).unwrap();
        let e = b.connect().unwrap_err();
        assert_eq!(e.errno, errno, "{path}: {}", e.msg);
        assert!(e.msg.contains("is not a PCI device"), "{path}: {}", e.msg);
        // Still in the created state.
        assert_eq!(b.get_u64("capacity").unwrap_err().errno, libc::ENODEV);
    }
}

#[test]
fn config_space_gives_libblkio_s_properties() {
    // capacity 2^19 sectors, size_max 0, seg_max 254, blk_size 4096, topology: exp 3,
    // alignment offset 1, opt_io 16; writeback 1; num_queues 2; max_discard 4194303 sectors,
    // discard alignment 8 sectors; max_write_zeroes 4194303.
    let mut cfg = [0u8; CONFIG_LEN as usize];
    cfg[..8].copy_from_slice(&(1u64 << 19).to_le_bytes());
    cfg[12..16].copy_from_slice(&254u32.to_le_bytes());
    cfg[20..24].copy_from_slice(&4096u32.to_le_bytes());
    cfg[24] = 3;
    cfg[25] = 1;
    cfg[28..32].copy_from_slice(&16u32.to_le_bytes());
    cfg[32] = 1;
    cfg[34..36].copy_from_slice(&2u16.to_le_bytes());
    cfg[36..40].copy_from_slice(&4194303u32.to_le_bytes());
    cfg[44..48].copy_from_slice(&8u32.to_le_bytes());
    cfg[48..52].copy_from_slice(&4194303u32.to_le_bytes());
    let all = WANTED & !F_RO;
    let i = blk_info(&cfg, all, false).info;
    assert_eq!(i.request_alignment, 4096);
    assert_eq!(i.optimal_io_alignment, 4096 << 3);
    assert_eq!(i.optimal_io_size, 4096 * 16);
    assert_eq!(i.discard_alignment_offset, 4096);
    assert_eq!(i.max_segments, 254);
    assert_eq!(i.max_segment_len, 0);
    assert_eq!(i.max_transfer, 0, "needs SIZE_MAX too");
    assert_eq!(i.max_discard_len, 2147483136);
    assert_eq!(i.max_write_zeroes_len, 2147483136);
    assert_eq!(i.discard_alignment, 4096);
    assert!(i.flush_needed);
    // Without the features: libblkio's created-state values.
    let i = blk_info(&cfg, F_VERSION_1, false).info;
    assert_eq!(
        (
            i.request_alignment,
            i.max_segments,
            i.max_discard_len,
            i.discard_alignment
        ),
        (512, 1, 0, 512)
    );
    assert!(!i.flush_needed);
    // A short configuration (a broken device) reads as zeros, no panic.
    let i = blk_info(&cfg[..10], all, false).info;
    assert_eq!(i.max_segments, 1);
}

#[test]
fn errors_keep_their_cause_as_source() {
    let io = || io::Error::from_raw_os_error(libc::EACCES);
    let cases: Vec<PciError> = vec![
        PciError::NotPci {
            path: "/x".into(),
            source: io(),
        },
        PciError::Open("/dev/vfio/3".into(), io()),
        PciError::Ioctl("VFIO_IOMMU_MAP_DMA", io()),
    ];
    for e in &cases {
        assert_cause_is_source(e, Some(&io().to_string()));
        assert_eq!(e.errno(), libc::EACCES);
    }
}
