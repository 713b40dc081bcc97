//! Zone management of a zoned namespace (NVMe Zoned Namespace Command Set spec, §3.4): the
//! Zone Management Send (open, close, finish, reset; Select All for the `*_all_zones` forms)
//! and Zone Management Receive (Report Zones) commands, and the report's zone descriptors
//! turned into `struct blkio_zone`.

use super::sys::Cmd;
use snapblk_core::{Zone, ZoneAction};

/// Zone Management Send / Receive opcodes.
pub(super) const OP_ZONE_SEND: u8 = 0x79;
pub(super) const OP_ZONE_RECV: u8 = 0x7a;
/// Zone Send Action (CDW13 bits 7:0).
const ZSA_CLOSE: u32 = 1;
const ZSA_FINISH: u32 = 2;
const ZSA_OPEN: u32 = 3;
const ZSA_RESET: u32 = 4;
/// CDW13 bit 8 of Zone Management Send: the action applies to every zone it can.
const ZSEND_SELECT_ALL: u32 = 1 << 8;
/// CDW13 of Zone Management Receive: action 0 (Report Zones), reporting option 0 (every
/// zone), and bit 16 Partial Report (the header counts the descriptors transferred).
const ZRECV_PARTIAL: u32 = 1 << 16;
/// Size of the report header and of one zone descriptor.
pub(super) const DESC: usize = 64;

/// Zone Management Send of `action` at `slba` (`None`: Select All).
pub(super) fn send(c: &mut Cmd, action: ZoneAction, slba: Option<u64>) {
    c.opcode = OP_ZONE_SEND;
    let s = slba.unwrap_or(0);
    c.cdw10 = s as u32;
    c.cdw11 = (s >> 32) as u32;
    c.cdw13 = match action {
        ZoneAction::Close => ZSA_CLOSE,
        ZoneAction::Finish => ZSA_FINISH,
        ZoneAction::Open => ZSA_OPEN,
        ZoneAction::Reset => ZSA_RESET,
    };
    if slba.is_none() {
        c.cdw13 |= ZSEND_SELECT_ALL;
    }
}

/// Zone Management Receive (Report Zones, partial) from `slba` into `buf`, whose length is a
/// multiple of 4 bytes.
pub(super) fn report(c: &mut Cmd, slba: u64, buf: &mut [u8]) {
    c.opcode = OP_ZONE_RECV;
    c.cdw10 = slba as u32;
    c.cdw11 = (slba >> 32) as u32;
    // NUMD: the number of dwords, 0-based.
    c.cdw12 = ((buf.len() / 4) as u32).saturating_sub(1);
    c.cdw13 = ZRECV_PARTIAL;
    c.addr = buf.as_mut_ptr() as u64;
    c.data_len = buf.len() as u32;
}

/// The report buffer's length for `nr_zones` descriptors, within `max_transfer` bytes (at
/// least one descriptor).
pub(super) fn report_len(nr_zones: u32, max_transfer: u64) -> usize {
    let fit = (max_transfer as usize / DESC).saturating_sub(1).max(1);
    DESC * (1 + (nr_zones as usize).min(fit))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Turn a Report Zones buffer (header, then descriptors) into `out`: at most as many zones as
/// the header counts, the buffer holds and `out` has room for. LBAs become bytes with
/// `lba_shift`; `zone_size` (bytes) is every zone's `len`. A full zone has no valid write
/// pointer (NVMe): it is reported at the zone's end, as libblkio and Linux do. Returns the
/// number filled.
pub(super) fn translate(data: &[u8], lba_shift: u32, zone_size: u64, out: &mut [Zone]) -> usize {
    let count = u64_at(data, 0);
    let held = (data.len() / DESC).saturating_sub(1);
    let n = usize::try_from(count)
        .unwrap_or(usize::MAX)
        .min(held)
        .min(out.len());
    let bytes = |lba: u64| {
        if lba_shift >= 64 || lba > u64::MAX >> lba_shift {
            u64::MAX
        } else {
            lba << lba_shift
        }
    };
    for (i, z) in out.iter_mut().take(n).enumerate() {
        let d = &data[DESC * (i + 1)..DESC * (i + 2)];
        // ZT in byte 0 bits 3:0 and ZS in byte 1 bits 7:4 use the values of
        // BLKIO_ZONE_TYPE_* and BLKIO_ZONE_STATE_*; RZR is bit 2 of the attributes (byte 2).
        let start = bytes(u64_at(d, 16));
        let state = d[1] >> 4;
        let wp = if state == Zone::STATE_FULL {
            start.saturating_add(zone_size)
        } else {
            bytes(u64_at(d, 24))
        };
        *z = Zone::new(
            start,
            zone_size,
            bytes(u64_at(d, 8)),
            wp,
            d[0] & 0xf,
            state,
            d[2] & (1 << 2) != 0,
        );
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor as the spec lays it out.
    fn desc(zt: u8, zs: u8, attr: u8, cap: u64, slba: u64, wp: u64) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0] = zt;
        d[1] = zs << 4;
        d[2] = attr;
        d[8..16].copy_from_slice(&cap.to_le_bytes());
        d[16..24].copy_from_slice(&slba.to_le_bytes());
        d[24..32].copy_from_slice(&wp.to_le_bytes());
        d
    }

    fn buf(count: u64, descs: &[[u8; 64]]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[0..8].copy_from_slice(&count.to_le_bytes());
        for d in descs {
            b.extend_from_slice(d);
        }
        b
    }

    #[test]
    fn descriptors_become_blkio_zones() {
        // 512-byte blocks, 4 MiB zones (8192 blocks): an empty zone, an implicitly open one
        // with 3 MiB of capacity and data written, a full one recommending a reset.
        let b = buf(
            3,
            &[
                desc(2, 1, 0, 8192, 0, 0),
                desc(2, 2, 0, 6144, 8192, 8192 + 256),
                desc(2, 0xe, 1 << 2, 8192, 16384, u64::MAX),
            ],
        );
        let mut out = [Zone::default(); 4];
        out[3] = Zone::new(7, 7, 7, 7, 7, 7, true);
        assert_eq!(translate(&b, 9, 4 << 20, &mut out), 3);
        assert_eq!(
            out[0],
            Zone::new(
                0,
                4 << 20,
                4 << 20,
                0,
                Zone::TYPE_SEQWRITE_REQ,
                Zone::STATE_EMPTY,
                false
            )
        );
        assert_eq!(
            out[1],
            Zone::new(
                4 << 20,
                4 << 20,
                3 << 20,
                (4 << 20) + (128 << 10),
                Zone::TYPE_SEQWRITE_REQ,
                Zone::STATE_IMP_OPEN,
                false
            )
        );
        assert_eq!(
            out[2],
            Zone::new(
                8 << 20,
                4 << 20,
                4 << 20,
                12 << 20,
                2,
                Zone::STATE_FULL,
                true
            )
        );
        // Entries past the report keep what the caller put there.
        assert_eq!(out[3], Zone::new(7, 7, 7, 7, 7, 7, true));
    }

    #[test]
    fn partial_reports_fill_no_more_than_asked_or_held() {
        let d = desc(2, 4, 0, 8, 0, 4);
        let b = buf(3, &[d, d, d]);
        let mut two = [Zone::default(); 2];
        assert_eq!(translate(&b, 12, 32 << 10, &mut two), 2);
        assert_eq!(two[1].zone_state, Zone::STATE_CLOSED);
        assert_eq!(two[1].write_pointer, 16 << 10);
        // A header counting more than the buffer holds, or a truncated buffer: no panic.
        let mut many = [Zone::default(); 8];
        assert_eq!(translate(&buf(100, &[d]), 9, 4096, &mut many), 1);
        assert_eq!(translate(&b[..100], 9, 4096, &mut many), 0);
        assert_eq!(translate(&[], 9, 4096, &mut many), 0);
        // Absurd LBAs saturate instead of overflowing.
        let big = buf(1, &[desc(2, 1, 0, u64::MAX, u64::MAX, u64::MAX)]);
        assert_eq!(translate(&big, 12, 4096, &mut many), 1);
        assert_eq!(many[0].start, u64::MAX);
    }

    #[test]
    fn commands_carry_the_action_and_range() {
        let mut c = Cmd::default();
        send(&mut c, ZoneAction::Reset, Some(0x1_0000_2000));
        assert_eq!((c.opcode, c.cdw10, c.cdw11, c.cdw13), (0x79, 0x2000, 1, 4));
        let mut c = Cmd::default();
        send(&mut c, ZoneAction::Open, None);
        assert_eq!((c.cdw10, c.cdw13), (0, 3 | 1 << 8));
        let mut c = Cmd::default();
        let mut b = vec![0u8; report_len(3, 1 << 20)];
        assert_eq!(b.len(), 256);
        report(&mut c, 8192, &mut b);
        assert_eq!(
            (c.opcode, c.cdw10, c.cdw12, c.cdw13, c.data_len),
            (0x7a, 8192, 63, 1 << 16, 256)
        );
        // The transfer limit caps the descriptors of one report.
        assert_eq!(report_len(1000, 4096), 4096);
        assert_eq!(report_len(1000, 64), 128);
    }
}
