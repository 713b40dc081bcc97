//! Zoned-storage requests (libblkio `blkioq_report_zones`, `blkioq_*_zone`,
//! `blkioq_*_all_zones`) and the zone descriptor they fill.

/// One zone as `struct blkio_zone` lays it out (64 bytes); the report-zones request fills an
/// array of these. Byte values, not blocks.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Zone {
    /// Byte offset of the zone's first block.
    pub start: u64,
    /// Zone size in bytes (the distance to the next zone's start).
    pub len: u64,
    /// Writable bytes of the zone (at most `len`).
    pub capacity: u64,
    /// Byte offset of the write pointer (meaningful in the states that have one).
    pub write_pointer: u64,
    /// One of the `Zone::TYPE_*` values (`BLKIO_ZONE_TYPE_*`).
    pub zone_type: u8,
    /// One of the `Zone::STATE_*` values (`BLKIO_ZONE_STATE_*`).
    pub zone_state: u8,
    /// Non-zero when the device recommends a reset of the zone (NVMe: Reset Zone Recommended).
    pub reset: u8,
    reserved: [u8; 29],
}

impl Zone {
    /// `BLKIO_ZONE_TYPE_CONVENTIONAL`.
    pub const TYPE_CONVENTIONAL: u8 = 1;
    /// `BLKIO_ZONE_TYPE_SEQWRITE_REQ`: sequential write required.
    pub const TYPE_SEQWRITE_REQ: u8 = 2;
    /// `BLKIO_ZONE_TYPE_SEQWRITE_PREF`: sequential write preferred.
    pub const TYPE_SEQWRITE_PREF: u8 = 3;
    /// `BLKIO_ZONE_STATE_EMPTY`.
    pub const STATE_EMPTY: u8 = 1;
    /// `BLKIO_ZONE_STATE_IMP_OPEN`: implicitly opened.
    pub const STATE_IMP_OPEN: u8 = 2;
    /// `BLKIO_ZONE_STATE_EXP_OPEN`: explicitly opened.
    pub const STATE_EXP_OPEN: u8 = 3;
    /// `BLKIO_ZONE_STATE_CLOSED`.
    pub const STATE_CLOSED: u8 = 4;
    /// `BLKIO_ZONE_STATE_READONLY`.
    pub const STATE_READONLY: u8 = 0xd;
    /// `BLKIO_ZONE_STATE_FULL`.
    pub const STATE_FULL: u8 = 0xe;
    /// `BLKIO_ZONE_STATE_OFFLINE`.
    pub const STATE_OFFLINE: u8 = 0xf;

    /// A descriptor from its fields (the reserved bytes zero).
    pub fn new(
        start: u64,
        len: u64,
        capacity: u64,
        write_pointer: u64,
        zone_type: u8,
        zone_state: u8,
        reset: bool,
    ) -> Self {
        Zone {
            start,
            len,
            capacity,
            write_pointer,
            zone_type,
            zone_state,
            reset: u8::from(reset),
            reserved: [0; 29],
        }
    }
}

/// What a zone management request does to its zone (or to all zones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneAction {
    /// Explicitly open (`blkioq_open_zone`).
    Open,
    /// Close (`blkioq_close_zone`).
    Close,
    /// Make full: the write pointer moves to the end (`blkioq_finish_zone`).
    Finish,
    /// Empty the zone: the write pointer back to its start (`blkioq_reset_zone`).
    Reset,
}

/// A zoned-storage request, the payload of [`crate::Op::Zone`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneOp {
    /// Fill `zones[..nr_zones]` with the zones from the one holding `offset` on; the device's
    /// zones past the last one reported are left untouched, and so are the entries past the
    /// device's last zone (`blkioq_report_zones`; the count actually filled is not returned,
    /// as in libblkio: zones past it keep what the caller put there).
    Report {
        /// Byte offset inside the first zone to report.
        offset: u64,
        /// The caller's array, writable for `nr_zones` entries until the completion.
        zones: *mut Zone,
        /// Number of entries of `zones`.
        nr_zones: u32,
    },
    /// A management action on the zone starting at `offset`, or on every zone when `offset`
    /// is `None` (the `blkioq_*_all_zones` forms).
    Manage {
        /// What to do.
        action: ZoneAction,
        /// The zone's start in bytes, `None` for all zones.
        offset: Option<u64>,
    },
}

impl ZoneOp {
    /// The byte offset the request names, if any.
    pub fn offset(&self) -> Option<u64> {
        match *self {
            ZoneOp::Report { offset, .. } => Some(offset),
            ZoneOp::Manage { offset, .. } => offset,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_matches_c_layout() {
        assert_eq!(std::mem::size_of::<Zone>(), 64);
        assert_eq!(std::mem::align_of::<Zone>(), 8);
        assert_eq!(std::mem::offset_of!(Zone, len), 8);
        assert_eq!(std::mem::offset_of!(Zone, capacity), 16);
        assert_eq!(std::mem::offset_of!(Zone, write_pointer), 24);
        assert_eq!(std::mem::offset_of!(Zone, zone_type), 32);
        assert_eq!(std::mem::offset_of!(Zone, zone_state), 33);
        assert_eq!(std::mem::offset_of!(Zone, reset), 34);
    }
}
