//! Identify data (NVMe base spec 2.0 §5.17, NVM and ZNS command set specs) to the facts the
//! driver needs, and the errors of probing a namespace. Pure functions over byte arrays, so
//! every field is unit-tested without a device.

use thiserror::Error;

/// Command set identifiers (CSI).
pub(crate) const CSI_NVM: u8 = 0;
pub(crate) const CSI_ZNS: u8 = 2;

/// Why a namespace cannot be used.
#[derive(Debug, Error)]
pub(crate) enum NvmeError {
    /// `path` names something other than a character device.
    #[error("The file must be a character device")]
    NotCharDevice,
    /// Opening or inspecting the path (or the `fd`) failed.
    #[error("opening {path}")]
    Open {
        /// The path given, or `fd N`.
        path: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// `NVME_IOCTL_ID` failed: not an NVMe namespace device.
    #[error("not an NVMe namespace character device (/dev/ngXnY): NVME_IOCTL_ID failed")]
    NotNamespace(#[source] std::io::Error),
    /// An Identify command could not be issued.
    #[error("Identify (CNS {cns:#x}) failed")]
    Identify {
        /// The Controller or Namespace Structure asked for.
        cns: u8,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// An Identify command completed with an NVMe error status.
    #[error("Identify (CNS {cns:#x}) failed with NVMe status {status:#x}")]
    IdentifyStatus {
        /// The Controller or Namespace Structure asked for.
        cns: u8,
        /// The status field of the completion.
        status: u32,
    },
    /// The formatted LBA format carries metadata.
    #[error(
        "the namespace's LBA format has {ms} bytes of metadata per block: only formats without metadata are supported"
    )]
    Metadata {
        /// Metadata bytes per LBA.
        ms: u16,
    },
    /// The block size is below 512 bytes or absurdly large.
    #[error("the namespace's LBA data size 2^{lbads} is not supported (must be 2^9 to 2^16)")]
    LbaSize {
        /// LBADS: log2 of the block size.
        lbads: u8,
    },
    /// Neither the NVM nor the zoned command set.
    #[error(
        "the namespace uses I/O command set {csi} (key-value, ...): only NVM (0) and zoned (2) namespaces are supported"
    )]
    CommandSet {
        /// The namespace's command set identifier.
        csi: u8,
    },
    /// The namespace has no capacity or an inconsistent zone layout.
    #[error("the namespace reports {what}")]
    Inconsistent {
        /// What is wrong.
        what: &'static str,
    },
}

impl NvmeError {
    /// The errno the C ABI reports for this error.
    pub(crate) fn errno(&self) -> i32 {
        match self {
            NvmeError::NotCharDevice => libc::EINVAL,
            NvmeError::Open { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            NvmeError::NotNamespace(e) | NvmeError::Identify { source: e, .. } => {
                e.raw_os_error().unwrap_or(libc::EIO)
            }
            NvmeError::IdentifyStatus { .. } | NvmeError::Inconsistent { .. } => libc::EIO,
            NvmeError::Metadata { .. } | NvmeError::LbaSize { .. } => libc::EINVAL,
            NvmeError::CommandSet { .. } => libc::ENOTSUP,
        }
    }
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    b.get(o..o + 2)
        .map_or(0, |x| u16::from_le_bytes([x[0], x[1]]))
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .map_or(0, |x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8).map_or(0, |x| {
        u64::from_le_bytes([x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]])
    })
}
fn byte(b: &[u8], o: usize) -> u8 {
    b.get(o).copied().unwrap_or(0)
}

/// ZSZE of the LBA format `format` in the ZNS namespace structure (Identify CNS 5, CSI 2):
/// the zone size in blocks, 0 if the structure has none.
pub(crate) fn zone_size_blocks(ns: &[u8], format: usize) -> u64 {
    u64_at(ns, 2816usize.saturating_add(format.saturating_mul(16)))
}

/// What Identify Namespace (CNS 0) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Namespace {
    /// NSZE: size in logical blocks.
    pub(crate) blocks: u64,
    /// log2 of the block size (LBADS of the formatted LBA format).
    pub(crate) lba_shift: u32,
    /// The index of the formatted LBA format (for the zoned LBA format extension).
    pub(crate) format: usize,
}

/// Parse Identify Namespace; refuses formats with metadata and block sizes outside 512 B..64 KiB.
pub(crate) fn namespace(b: &[u8]) -> Result<Namespace, NvmeError> {
    let blocks = u64_at(b, 0);
    let nlbaf = usize::from(byte(b, 25));
    let flbas = byte(b, 26);
    // FLBAS bits 3:0 are the low nibble of the format index, bits 6:5 the high bits (used when
    // more than 16 formats exist).
    let mut format = usize::from(flbas & 0xf);
    if nlbaf >= 16 {
        format |= usize::from((flbas >> 5) & 3) << 4;
    }
    let lbaf = u32_at(b, 128 + 4 * format);
    let ms = (lbaf & 0xffff) as u16;
    let lbads = ((lbaf >> 16) & 0xff) as u8;
    if ms != 0 {
        return Err(NvmeError::Metadata { ms });
    }
    if !(9..=16).contains(&lbads) {
        return Err(NvmeError::LbaSize { lbads });
    }
    if blocks == 0 {
        return Err(NvmeError::Inconsistent {
            what: "a size of 0 blocks",
        });
    }
    Ok(Namespace {
        blocks,
        lba_shift: u32::from(lbads),
        format,
    })
}

/// What Identify Controller (CNS 1) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Controller {
    /// Maximum data transfer size in bytes (None: no limit), assuming the 4 KiB minimum memory
    /// page size (CAP.MPSMIN = 0) that every controller the kernel drives with 4 KiB pages has.
    pub(crate) mdts_bytes: Option<u64>,
    /// VWC bit 0: a volatile write cache is present.
    pub(crate) vwc: bool,
    /// ONCS bit 2: Dataset Management (discard).
    pub(crate) dsm: bool,
    /// ONCS bit 3: Write Zeroes.
    pub(crate) write_zeroes: bool,
}

/// Parse Identify Controller.
pub(crate) fn controller(b: &[u8]) -> Controller {
    let mdts = byte(b, 77);
    let oncs = u16_at(b, 520);
    Controller {
        mdts_bytes: (mdts != 0).then(|| 4096u64 << mdts.min(40)),
        vwc: byte(b, 525) & 1 != 0,
        dsm: oncs & (1 << 2) != 0,
        write_zeroes: oncs & (1 << 3) != 0,
    }
}

/// The command set of a namespace from its Namespace Identification Descriptor list (CNS 3):
/// the CSI descriptor (type 4), NVM when there is none.
pub(crate) fn csi(b: &[u8]) -> u8 {
    let mut o = 0;
    while o + 4 <= b.len() {
        let (nidt, nidl) = (byte(b, o), usize::from(byte(b, o + 1)));
        if nidt == 0 || nidl == 0 {
            break;
        }
        if nidt == 4 {
            return byte(b, o + 4);
        }
        o += 4 + nidl;
    }
    CSI_NVM
}

/// The NVM command set's Identify Controller (CNS 6, CSI 0): write-zeroes size limit in bytes
/// (WZSL, None: no limit), again in 4 KiB units.
pub(crate) fn nvm_controller_wzsl(b: &[u8]) -> Option<u64> {
    let w = byte(b, 1);
    (w != 0).then(|| 4096u64 << w.min(40))
}

/// What the zoned namespace structures say (Identify CNS 5 and CNS 6 with CSI 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Zones {
    /// Zone size in bytes.
    pub(crate) zone_size: u64,
    /// Number of zones.
    pub(crate) nr_zones: u64,
    /// Maximum open zones (0: no limit).
    pub(crate) max_open: i32,
    /// Maximum active zones (0: no limit).
    pub(crate) max_active: i32,
    /// Zone append size limit in bytes.
    pub(crate) append_max: u64,
}

/// Parse the ZNS namespace (`ns`, CNS 5) and controller (`ctrl`, CNS 6) structures of a
/// namespace of `n`, whose controller transfers at most `mdts` bytes.
pub(crate) fn zones(
    ns: &[u8],
    ctrl: &[u8],
    n: &Namespace,
    mdts: Option<u64>,
) -> Result<Zones, NvmeError> {
    // MAR and MOR are 0-based, all ones meaning no limit.
    let limit = |v: u32| {
        if v == u32::MAX {
            0
        } else {
            i32::try_from(u64::from(v) + 1).unwrap_or(i32::MAX)
        }
    };
    let mar = u32_at(ns, 4);
    let mor = u32_at(ns, 8);
    // The LBA format extension of the formatted format: ZSZE (zone size in blocks).
    let zsze = zone_size_blocks(ns, n.format);
    if zsze == 0 {
        return Err(NvmeError::Inconsistent {
            what: "a zone size of 0 blocks",
        });
    }
    if zsze > n.blocks {
        return Err(NvmeError::Inconsistent {
            what: "a zone size larger than the namespace",
        });
    }
    let zone_size = zsze
        .checked_mul(1u64 << n.lba_shift)
        .ok_or(NvmeError::Inconsistent {
            what: "a zone size beyond 2^64 bytes",
        })?;
    // ZASL in 4 KiB units, 0 meaning "as MDTS".
    let zasl = byte(ctrl, 0);
    let append_max = if zasl != 0 {
        4096u64 << zasl.min(40)
    } else {
        mdts.unwrap_or(u64::from(u32::MAX) << n.lba_shift)
    };
    Ok(Zones {
        zone_size,
        nr_zones: n.blocks / zsze,
        max_open: limit(mor),
        max_active: limit(mar),
        append_max,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns_page(nsze: u64, flbas: u8, lbafs: &[(u16, u8)]) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        b[0..8].copy_from_slice(&nsze.to_le_bytes());
        b[25] = lbafs.len().saturating_sub(1) as u8;
        b[26] = flbas;
        for (i, &(ms, lbads)) in lbafs.iter().enumerate() {
            let v = u32::from(ms) | (u32::from(lbads) << 16);
            b[128 + 4 * i..132 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn namespace_uses_the_formatted_lba_format() {
        let b = ns_page(1 << 19, 1, &[(0, 9), (0, 12)]);
        assert_eq!(
            namespace(&b).unwrap(),
            Namespace {
                blocks: 1 << 19,
                lba_shift: 12,
                format: 1
            }
        );
        let b = ns_page(1 << 19, 0, &[(0, 9), (0, 12)]);
        assert_eq!(namespace(&b).unwrap().lba_shift, 9);
    }

    #[test]
    fn namespace_refuses_metadata_and_bad_sizes() {
        let b = ns_page(1024, 1, &[(0, 9), (8, 9)]);
        assert!(matches!(namespace(&b), Err(NvmeError::Metadata { ms: 8 })));
        let b = ns_page(1024, 0, &[(0, 8)]);
        assert!(matches!(
            namespace(&b),
            Err(NvmeError::LbaSize { lbads: 8 })
        ));
        let b = ns_page(0, 0, &[(0, 9)]);
        assert!(matches!(namespace(&b), Err(NvmeError::Inconsistent { .. })));
        // A truncated page reads as zeros: no panic, an error.
        assert!(namespace(&[1, 2, 3]).is_err());
    }

    #[test]
    fn namespace_format_index_uses_the_high_bits_beyond_16_formats() {
        let mut lbafs = vec![(0u16, 9u8); 20];
        lbafs[17] = (0, 12);
        // index 17 = low nibble 1, high bits (6:5) = 1.
        let b = ns_page(64, 0x21, &lbafs);
        assert_eq!(namespace(&b).unwrap().format, 17);
        assert_eq!(namespace(&b).unwrap().lba_shift, 12);
    }

    #[test]
    fn controller_fields() {
        let mut b = vec![0u8; 4096];
        b[77] = 7;
        b[520] = 0b1100;
        b[525] = 1;
        let c = controller(&b);
        assert_eq!(c.mdts_bytes, Some(512 * 1024));
        assert!(c.vwc && c.dsm && c.write_zeroes);
        let c = controller(&[0u8; 4096]);
        assert_eq!(c.mdts_bytes, None);
        assert!(!c.vwc && !c.dsm && !c.write_zeroes);
    }

    #[test]
    fn csi_from_descriptors() {
        let mut b = vec![0u8; 4096];
        // EUI64 descriptor (type 1, 8 bytes), then CSI (type 4, 1 byte) = 2.
        b[0] = 1;
        b[1] = 8;
        b[12] = 4;
        b[13] = 1;
        b[16] = 2;
        assert_eq!(csi(&b), CSI_ZNS);
        assert_eq!(csi(&[0u8; 4096]), CSI_NVM);
        // A descriptor list that runs off the end stops without panicking.
        assert_eq!(csi(&[1, 255, 0, 0, 9]), CSI_NVM);
    }

    #[test]
    fn zones_from_qemu_like_structures() {
        let n = Namespace {
            blocks: 1 << 19,
            lba_shift: 9,
            format: 0,
        };
        let mut ns = vec![0u8; 4096];
        ns[4..8].copy_from_slice(&7u32.to_le_bytes());
        ns[8..12].copy_from_slice(&7u32.to_le_bytes());
        ns[2816..2824].copy_from_slice(&32768u64.to_le_bytes());
        let z = zones(&ns, &[0u8; 4096], &n, Some(512 * 1024)).unwrap();
        assert_eq!(
            z,
            Zones {
                zone_size: 16 << 20,
                nr_zones: 16,
                max_open: 8,
                max_active: 8,
                append_max: 512 * 1024,
            }
        );
        ns[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut ctrl = vec![0u8; 4096];
        ctrl[0] = 1;
        let z = zones(&ns, &ctrl, &n, None).unwrap();
        assert_eq!((z.max_active, z.append_max), (0, 8192));
        ns[2816..2824].copy_from_slice(&0u64.to_le_bytes());
        assert!(zones(&ns, &ctrl, &n, None).is_err());
        // A zone larger than the namespace, or beyond 2^64 bytes: errors, not a wrap.
        ns[2816..2824].copy_from_slice(&((1u64 << 19) + 1).to_le_bytes());
        let e = zones(&ns, &ctrl, &n, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the namespace reports a zone size larger than the namespace"
        );
        let huge = Namespace {
            blocks: u64::MAX,
            ..n
        };
        ns[2816..2824].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let e = zones(&ns, &ctrl, &huge, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the namespace reports a zone size beyond 2^64 bytes"
        );
    }

    #[test]
    fn errors_keep_their_cause() {
        use snapblk_testsupport::errors::assert_cause_is_source;
        let io = |e| std::io::Error::from_raw_os_error(e);
        let cases: Vec<(NvmeError, i32)> = vec![
            (
                NvmeError::Open {
                    path: "/dev/ng9n1".into(),
                    source: io(libc::ENOENT),
                },
                libc::ENOENT,
            ),
            (NvmeError::NotNamespace(io(libc::ENOTTY)), libc::ENOTTY),
            (
                NvmeError::Identify {
                    cns: 1,
                    source: io(libc::EPERM),
                },
                libc::EPERM,
            ),
        ];
        for (e, errno) in cases {
            assert_cause_is_source(&e, None);
            assert_eq!(e.errno(), errno, "{e}");
        }
        // The variants without a cause: their errno.
        assert_eq!(NvmeError::NotCharDevice.errno(), libc::EINVAL);
        assert_eq!(NvmeError::Metadata { ms: 8 }.errno(), libc::EINVAL);
        assert_eq!(NvmeError::LbaSize { lbads: 8 }.errno(), libc::EINVAL);
        assert_eq!(NvmeError::CommandSet { csi: 1 }.errno(), libc::ENOTSUP);
        let e = NvmeError::IdentifyStatus { cns: 5, status: 2 };
        assert_eq!(
            e.to_string(),
            "Identify (CNS 0x5) failed with NVMe status 0x2"
        );
        assert_eq!(e.errno(), libc::EIO);
    }
}
