//! Device lifecycle and the property machinery shared by all drivers.

use crate::mem::MemRegion;
use crate::props::{Access, PropSpec, PropType, PropValue};
use crate::queue::Queue;
use crate::{Error, Result};

/// Lifecycle state; it only moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    /// Fresh from [`Blkio::new`]: only `RwCreated` properties (e.g. `path`, `read-only`) may be
    /// set, and nothing is opened yet.
    Created,
    /// After [`Blkio::connect`]: the device is open, its [`DeviceInfo`] is known, queue counts
    /// may be set.
    Connected,
    /// After [`Blkio::start`]: queues exist and I/O may be submitted.
    Started,
}

/// What a driver learned about its device at connect time; backs the common read-only properties.
///
/// A driver returns it from [`Driver::connect`]; [`Blkio`] keeps it and answers the libblkio
/// property named on each field from it (before connect, the properties that need a connection
/// fail with `ENODEV`). All sizes, lengths and alignments are in bytes; alignments are powers of
/// two, and 1 means "none". Start from [`DeviceInfo::default`] (a buffered regular file) and
/// override what the device knows.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// `read-only`: writes, discards and write-zeroes fail. True when the caller asked for a
    /// read-only connect or the device cannot be written (e.g. a snapshot without `writable`).
    pub read_only: bool,
    /// `request-alignment`: every request offset and length must be a multiple of this (the
    /// logical block size under `O_DIRECT`, 1 for buffered files).
    pub request_alignment: i32,
    /// `buf-alignment`: every request buffer address (and iovec base) must be a multiple of this.
    pub buf_alignment: i32,
    /// `optimal-io-alignment`: offsets and lengths that are multiples of this avoid
    /// read-modify-write in the device (e.g. the physical block size).
    pub optimal_io_alignment: i32,
    /// `optimal-io-size`: the request length the device prefers (e.g. a RAID stripe), 0 if it
    /// states none.
    pub optimal_io_size: i32,
    /// `optimal-buf-alignment`: buffer address alignment that performs best (the page size for
    /// the file drivers).
    pub optimal_buf_alignment: i32,
    /// `mem-region-alignment`: address and length alignment required of memory regions
    /// allocated or mapped on this device.
    pub mem_region_alignment: u64,
    /// `max-transfer`: the largest read or write request in bytes, 0 for no limit.
    pub max_transfer: i32,
    /// `max-segments`: the most iovecs one readv/writev request may carry.
    pub max_segments: i32,
    /// `max-segment-len`: the longest single iovec in bytes, 0 for no limit.
    pub max_segment_len: i32,
    /// `max-write-zeroes-len`: the longest write-zeroes request in bytes, 0 for no limit.
    pub max_write_zeroes_len: u64,
    /// `max-discard-len`: the longest discard request in bytes, 0 for no limit.
    pub max_discard_len: u64,
    /// `discard-alignment`: discards are effective only on ranges aligned to this (the
    /// device's discard granularity).
    pub discard_alignment: i32,
    /// `discard-alignment-offset`: the offset of the first discard-aligned byte from offset 0.
    pub discard_alignment_offset: i32,
    /// `supports-fua-natively`: the device implements [`crate::ReqFlags::FUA`] itself (for the
    /// file drivers, the sysfs `fua` attribute); otherwise a FUA write costs a cache flush,
    /// issued by the kernel or the driver.
    pub supports_fua_natively: bool,
    /// `supports-poll-queues`: `num-poll-queues` may be above 0 (the driver can busy-poll
    /// completions instead of waiting for interrupts).
    pub supports_poll_queues: bool,
    /// `flush-needed`: completed writes may sit in a volatile cache, so durability needs
    /// [`crate::Op::Flush`] (or FUA). False only where a write is durable when it completes.
    pub flush_needed: bool,
    /// `can-grow`: the capacity may increase while connected (a regular file that is extended);
    /// `capacity` is re-read on every get.
    pub can_grow: bool,
    /// `max-queues`: the most queues (regular plus poll) `start` may create.
    pub max_queues: i32,
    /// `needs-mem-regions`: request buffers must lie inside mapped memory regions.
    pub needs_mem_regions: bool,
    /// `needs-mem-region-fd`: memory regions must have a file descriptor.
    pub needs_mem_region_fd: bool,
    /// `may-pin-mem-regions`: the driver may pin mapped regions' pages in RAM (a device or
    /// another process accesses them directly).
    pub may_pin_mem_regions: bool,
    /// `max-mem-regions`: the most memory regions that may be mapped at once.
    pub max_mem_regions: u64,
}

impl Default for DeviceInfo {
    /// Values of a buffered regular file: byte-granular, page-aligned buffers preferred.
    fn default() -> Self {
        DeviceInfo {
            read_only: false,
            request_alignment: 1,
            buf_alignment: 1,
            optimal_io_alignment: 4096,
            optimal_io_size: 0,
            optimal_buf_alignment: 4096,
            mem_region_alignment: 1,
            max_transfer: 0,
            max_segments: 1024,
            max_segment_len: 0,
            max_write_zeroes_len: 0,
            max_discard_len: 0,
            discard_alignment: 1,
            discard_alignment_offset: 0,
            supports_fua_natively: false,
            supports_poll_queues: false,
            flush_needed: true,
            can_grow: false,
            max_queues: i32::MAX,
            needs_mem_regions: false,
            needs_mem_region_fd: false,
            may_pin_mem_regions: false,
            max_mem_regions: u64::MAX,
        }
    }
}

/// A driver: the device-specific half of a [`Blkio`]. The generic half (state machine, common
/// properties, queue slots, memory regions) lives in [`Blkio`] so all drivers behave alike.
pub trait Driver: Send {
    /// The name given to `blkio_create` (e.g. `io_uring`).
    fn name(&self) -> &str;
    /// Driver-specific properties (e.g. `path`, `direct`, `num-entries`). Common ones are
    /// handled by [`Blkio`] and must not be listed.
    fn props(&self) -> &'static [PropSpec] {
        &[]
    }
    /// Read a driver property. Existence, type and the `needs_connect` rule are already checked.
    fn get_prop(&self, name: &str, state: State) -> Result<PropValue>;
    /// Write a driver property. Existence, type and access rules are already checked; the driver
    /// validates the value.
    fn set_prop(&mut self, name: &str, value: PropValue, state: State) -> Result<()>;
    /// Open/attach the device. On failure the instance stays in the created state.
    fn connect(&mut self, read_only: bool) -> Result<DeviceInfo>;
    /// Device size in bytes (evaluated on every get, so a growing file is followed).
    fn capacity(&self) -> Result<u64>;
    /// The common properties' values before connect, for drivers whose libblkio counterpart
    /// answers them in the created state (the virtio-blk drivers: alignments and limits have
    /// defaults there, and only `capacity`, `max-queues` and `max-mem-regions` need a
    /// connection). `None`, the default, is io_uring's rule: the alignment and limit properties
    /// fail with `ENODEV` until connect, and the rest read as [`DeviceInfo::default`].
    fn created_info(&self) -> Option<DeviceInfo> {
        None
    }
    /// Change the device's size to `size` bytes (connected or started, not read-only): what
    /// lies past a shrinking device's new end is dropped, a grown range reads as zeros, and
    /// [`Driver::capacity`] and the queues' bounds follow. The default: `ENOTSUP`, for
    /// devices whose size is not theirs to change (a block device, a virtio disk).
    fn resize(&mut self, _size: u64) -> Result<()> {
        Err(Error::new(
            libc::ENOTSUP,
            format!("the {} driver cannot resize its device", self.name()),
        ))
    }
    /// Whether [`Driver::resize`] can change this device's size once it is open read-write
    /// (asked before a merge that would grow it, which may open it read-only to check). The
    /// default, `false`, goes with the default `resize`.
    fn can_resize(&self) -> bool {
        false
    }
    /// Create a queue (called by start and by add_queue).
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>>;
    /// Called by start once every queue exists, before the instance is started: a virtio
    /// device goes live (`DRIVER_OK`) only after all its virtqueues are set up. On failure the
    /// queues are dropped and the instance stays connected.
    fn queues_created(&mut self) -> Result<()> {
        Ok(())
    }
    /// Whether queues can be added after start.
    fn can_add_queues(&self) -> bool {
        true
    }
    /// Register a memory region with the device (drivers that can use registered buffers do).
    fn map_mem_region(&mut self, _region: &MemRegion) -> Result<()> {
        Ok(())
    }
    /// Undo [`Driver::map_mem_region`].
    fn unmap_mem_region(&mut self, _region: &MemRegion) {}
    /// Names of the devices this driver opens from a nested device spec (the snapshot
    /// driver's `base`). For each name `P`, every property `P.NAME` (`NAME` not empty) is a
    /// string property writable before connect and handed to [`Driver::set_prop`] and
    /// [`Driver::get_prop`] under its full dotted name: `base.driver=rbd`, `base.pool=p`, as
    /// QEMU's dotted keys.
    fn child_devices(&self) -> &'static [&'static str] {
        &[]
    }
}

/// The spec of every child-device property (`PREFIX.NAME`, see [`Driver::child_devices`]).
static CHILD_PROP: PropSpec = PropSpec::new("<child>", Str, Access::RwCreated, false);

use PropType::{Bool, Int, Str, U64};

/// Properties every driver has, handled here.
const COMMON: &[PropSpec] = &[
    PropSpec::new("driver", Str, Access::ReadOnly, false),
    PropSpec::new("read-only", Bool, Access::RwCreated, false),
    PropSpec::new("can-add-queues", Bool, Access::ReadOnly, false),
    PropSpec::new("capacity", U64, Access::ReadOnly, true),
    PropSpec::new("max-queues", Int, Access::ReadOnly, false),
    PropSpec::new("num-queues", Int, Access::RwConnected, false),
    PropSpec::new("num-poll-queues", Int, Access::RwConnected, false),
    PropSpec::new("supports-poll-queues", Bool, Access::ReadOnly, false),
    PropSpec::new("max-mem-regions", U64, Access::ReadOnly, false),
    PropSpec::new("may-pin-mem-regions", Bool, Access::ReadOnly, false),
    PropSpec::new("mem-region-alignment", U64, Access::ReadOnly, true),
    PropSpec::new("needs-mem-regions", Bool, Access::ReadOnly, false),
    PropSpec::new("needs-mem-region-fd", Bool, Access::ReadOnly, false),
    PropSpec::new("optimal-io-alignment", Int, Access::ReadOnly, true),
    PropSpec::new("optimal-io-size", Int, Access::ReadOnly, true),
    PropSpec::new("request-alignment", Int, Access::ReadOnly, true),
    PropSpec::new("flush-needed", Bool, Access::ReadOnly, false),
    PropSpec::new("buf-alignment", Int, Access::ReadOnly, true),
    PropSpec::new("can-grow", Bool, Access::ReadOnly, false),
    PropSpec::new("max-segments", Int, Access::ReadOnly, true),
    PropSpec::new("max-segment-len", Int, Access::ReadOnly, true),
    PropSpec::new("max-transfer", Int, Access::ReadOnly, true),
    PropSpec::new("optimal-buf-alignment", Int, Access::ReadOnly, true),
    PropSpec::new("supports-fua-natively", Bool, Access::ReadOnly, false),
    PropSpec::new("max-write-zeroes-len", U64, Access::ReadOnly, true),
    PropSpec::new("discard-alignment", Int, Access::ReadOnly, true),
    PropSpec::new("discard-alignment-offset", Int, Access::ReadOnly, true),
    PropSpec::new("max-discard-len", U64, Access::ReadOnly, true),
];

type Slots = Vec<Option<Box<dyn Queue>>>;

/// A device instance: a driver plus the generic lifecycle, properties, queues and regions.
pub struct Blkio {
    driver: Box<dyn Driver>,
    state: State,
    read_only: bool,
    num_queues: i32,
    num_poll_queues: i32,
    info: Option<DeviceInfo>,
    queues: Slots,
    poll_queues: Slots,
    allocated: Vec<MemRegion>,
    mapped: Vec<MemRegion>,
}

impl Blkio {
    /// A new instance in the created state.
    pub fn new(driver: Box<dyn Driver>) -> Self {
        Blkio {
            driver,
            state: State::Created,
            read_only: false,
            num_queues: 1,
            num_poll_queues: 0,
            info: None,
            queues: Vec::new(),
            poll_queues: Vec::new(),
            allocated: Vec::new(),
            mapped: Vec::new(),
        }
    }

    /// The current lifecycle state.
    pub fn state(&self) -> State {
        self.state
    }
    /// The driver's name as given to `blkio_create` (the `driver` property).
    pub fn driver_name(&self) -> &str {
        self.driver.name()
    }
    /// The driver, for driver-specific Rust APIs (downcast by the caller's own means).
    pub fn driver(&self) -> &dyn Driver {
        &*self.driver
    }
    /// Connect-time device facts (`None` before connect).
    pub fn info(&self) -> Option<&DeviceInfo> {
        self.info.as_ref()
    }

    /// All property specs: common ones, then the driver's.
    pub fn prop_specs(&self) -> impl Iterator<Item = &'static PropSpec> + '_ {
        COMMON.iter().chain(self.driver.props().iter())
    }

    fn spec(&self, name: &str) -> Result<&'static PropSpec> {
        if self.is_child_prop(name) {
            return Ok(&CHILD_PROP);
        }
        self.prop_specs()
            .find(|p| p.name == name)
            .ok_or_else(|| Error::new(libc::ENOENT, "Unknown property name"))
    }

    /// True for a property of a child device: `P.NAME` with `P` one of the driver's
    /// [`Driver::child_devices`] and `NAME` not empty.
    pub fn is_child_prop(&self, name: &str) -> bool {
        name.split_once('.')
            .is_some_and(|(p, rest)| !rest.is_empty() && self.driver.child_devices().contains(&p))
    }

    fn need_connected(&self) -> Result<&DeviceInfo> {
        self.info
            .as_ref()
            .ok_or_else(|| Error::new(libc::ENODEV, "Device must be connected"))
    }

    /// Get a property. `want` is the accessor's type (`None` for the string accessor, which
    /// accepts every type).
    pub fn get(&self, name: &str, want: Option<PropType>) -> Result<PropValue> {
        let spec = self.spec(name)?;
        if let Some(w) = want
            && w != spec.ty
        {
            return Err(Error::new(
                libc::ENOTTY,
                match w {
                    Bool => "Property is not a bool",
                    Int => "Property is not an int",
                    U64 => "Property is not an unsigned 64-bit integer",
                    Str => "Property is not a string",
                },
            ));
        }
        let created = match self.state {
            State::Created => self.driver.created_info(),
            _ => None,
        };
        let need_connect = match created {
            Some(_) => matches!(name, "capacity" | "max-queues" | "max-mem-regions"),
            None => spec.needs_connect && self.state == State::Created,
        };
        if need_connect {
            return Err(Error::new(libc::ENODEV, "Device must be connected"));
        }
        let info = self.info.as_ref().or(created.as_ref());
        let d = DeviceInfo::default();
        let i = info.unwrap_or(&d);
        Ok(match name {
            "driver" => PropValue::Str(self.driver.name().to_owned()),
            "read-only" => {
                PropValue::Bool(self.info.as_ref().map_or(self.read_only, |i| i.read_only))
            }
            "can-add-queues" => PropValue::Bool(self.driver.can_add_queues()),
            "capacity" => PropValue::U64(self.driver.capacity()?),
            "max-queues" => PropValue::Int(i.max_queues),
            "num-queues" => PropValue::Int(self.num_queues),
            "num-poll-queues" => PropValue::Int(self.num_poll_queues),
            "supports-poll-queues" => PropValue::Bool(info.is_some_and(|i| i.supports_poll_queues)),
            "max-mem-regions" => PropValue::U64(i.max_mem_regions),
            "may-pin-mem-regions" => PropValue::Bool(i.may_pin_mem_regions),
            "needs-mem-regions" => PropValue::Bool(i.needs_mem_regions),
            "needs-mem-region-fd" => PropValue::Bool(i.needs_mem_region_fd),
            "mem-region-alignment" => PropValue::U64(i.mem_region_alignment),
            "optimal-io-alignment" => PropValue::Int(i.optimal_io_alignment),
            "optimal-io-size" => PropValue::Int(i.optimal_io_size),
            "request-alignment" => PropValue::Int(i.request_alignment),
            "flush-needed" => PropValue::Bool(i.flush_needed),
            "buf-alignment" => PropValue::Int(i.buf_alignment),
            "can-grow" => PropValue::Bool(info.is_some_and(|i| i.can_grow)),
            "max-segments" => PropValue::Int(i.max_segments),
            "max-segment-len" => PropValue::Int(i.max_segment_len),
            "max-transfer" => PropValue::Int(i.max_transfer),
            "optimal-buf-alignment" => PropValue::Int(i.optimal_buf_alignment),
            "supports-fua-natively" => {
                PropValue::Bool(info.is_some_and(|i| i.supports_fua_natively))
            }
            "max-write-zeroes-len" => PropValue::U64(i.max_write_zeroes_len),
            "discard-alignment" => PropValue::Int(i.discard_alignment),
            "discard-alignment-offset" => PropValue::Int(i.discard_alignment_offset),
            "max-discard-len" => PropValue::U64(i.max_discard_len),
            // A child property's name is its own (the spec is shared).
            _ => self.driver.get_prop(name, self.state)?,
        })
    }

    /// Get a bool property (`blkio_get_bool`); `ENOTTY` if the property has another type.
    pub fn get_bool(&self, name: &str) -> Result<bool> {
        match self.get(name, Some(Bool))? {
            PropValue::Bool(b) => Ok(b),
            _ => Err(Error::new(libc::ENOTTY, "Property is not a bool")),
        }
    }
    /// Get an int property (`blkio_get_int`); `ENOTTY` if the property has another type.
    pub fn get_int(&self, name: &str) -> Result<i32> {
        match self.get(name, Some(Int))? {
            PropValue::Int(v) => Ok(v),
            _ => Err(Error::new(libc::ENOTTY, "Property is not an int")),
        }
    }
    /// Get a u64 property (`blkio_get_uint64`); `ENOTTY` if the property has another type.
    pub fn get_u64(&self, name: &str) -> Result<u64> {
        match self.get(name, Some(U64))? {
            PropValue::U64(v) => Ok(v),
            _ => Err(Error::new(
                libc::ENOTTY,
                "Property is not an unsigned 64-bit integer",
            )),
        }
    }
    /// Any property, formatted as a string.
    pub fn get_str(&self, name: &str) -> Result<String> {
        self.get(name, None).map(|v| v.to_display_string())
    }

    /// Set a property to a typed value (type must match exactly, else `ENOTTY`). The access
    /// rule is checked against the state: read-only properties fail with `EACCES`, `RwCreated`
    /// ones after connect with `EBUSY`, `RwConnected` ones outside the connected state.
    pub fn set(&mut self, name: &str, value: PropValue) -> Result<()> {
        let spec = self.spec(name)?;
        if spec.ty != value.ty() {
            return Err(Error::new(
                libc::ENOTTY,
                match value.ty() {
                    Bool => "Property is not a bool",
                    Int => "Property is not an int",
                    U64 => "Property is not an unsigned 64-bit int",
                    Str => "Property is not a string",
                },
            ));
        }
        self.set_checked_named(spec, name, value)
    }

    /// Set any property from a string, parsed into its type (`blkio_set_str`).
    pub fn set_str(&mut self, name: &str, value: &str) -> Result<()> {
        let spec = self.spec(name)?;
        let v = PropValue::parse(spec.ty, value)?;
        self.set_checked_named(spec, name, v)
    }

    /// Set a bool property (`blkio_set_bool`); see [`Blkio::set`] for the checks.
    pub fn set_bool(&mut self, name: &str, v: bool) -> Result<()> {
        self.set(name, PropValue::Bool(v))
    }
    /// Set an int property (`blkio_set_int`); see [`Blkio::set`] for the checks.
    pub fn set_int(&mut self, name: &str, v: i32) -> Result<()> {
        self.set(name, PropValue::Int(v))
    }
    /// Set a u64 property (`blkio_set_uint64`); see [`Blkio::set`] for the checks.
    pub fn set_u64(&mut self, name: &str, v: u64) -> Result<()> {
        self.set(name, PropValue::U64(v))
    }

    fn set_checked_named(&mut self, spec: &PropSpec, name: &str, value: PropValue) -> Result<()> {
        match spec.access {
            Access::ReadOnly => return Err(Error::new(libc::EACCES, "Property is read-only")),
            Access::RwCreated if self.state >= State::Connected => {
                return Err(Error::new(
                    libc::EBUSY,
                    "Cannot set property in connected state",
                ));
            }
            Access::RwConnected if self.state == State::Created => {
                return Err(Error::new(libc::ENODEV, "Device must be connected"));
            }
            Access::RwConnected if self.state == State::Started => {
                return Err(Error::new(
                    libc::EBUSY,
                    "Cannot set property in started state",
                ));
            }
            _ => {}
        }
        if std::ptr::eq(spec, &CHILD_PROP) {
            return self.driver.set_prop(name, value, self.state);
        }
        match (spec.name, value) {
            ("read-only", PropValue::Bool(b)) => self.read_only = b,
            ("num-queues", PropValue::Int(n)) => {
                if n < 0 {
                    return Err(Error::inval(
                        "num_queues must be equal to or greater than 0",
                    ));
                }
                self.num_queues = n;
            }
            ("num-poll-queues", PropValue::Int(n)) => {
                if n < 0 {
                    return Err(Error::inval(
                        "num_poll_queues must be equal to or greater than 0",
                    ));
                }
                self.num_poll_queues = n;
            }
            (name, v) => self.driver.set_prop(name, v, self.state)?,
        }
        Ok(())
    }

    /// created → connected. Idempotent when connected; EBUSY when started.
    pub fn connect(&mut self) -> Result<()> {
        match self.state {
            State::Connected => return Ok(()),
            State::Started => {
                return Err(Error::new(
                    libc::EBUSY,
                    "Cannot set property in connected state",
                ));
            }
            State::Created => {}
        }
        let info = self.driver.connect(self.read_only)?;
        self.info = Some(info);
        self.state = State::Connected;
        Ok(())
    }

    /// Resize the device to `size` bytes ([`Driver::resize`]): connected or started, never
    /// read-only (`EROFS`); `ENOTSUP` from drivers that cannot.
    pub fn resize(&mut self, size: u64) -> Result<()> {
        if self.state == State::Created {
            return Err(Error::new(libc::ENODEV, "Device must be connected"));
        }
        if self.read_only || self.info.as_ref().is_some_and(|i| i.read_only) {
            return Err(Error::new(libc::EROFS, "the device is read-only"));
        }
        self.driver.resize(size)
    }

    /// Whether the driver can resize the device when it is open read-write
    /// ([`Driver::can_resize`]), also asked of an instance open read-only; `false` before
    /// connect.
    pub fn can_resize(&self) -> bool {
        self.state != State::Created && self.driver.can_resize()
    }

    /// connected → started: creates `num-queues` queues and `num-poll-queues` poll queues.
    pub fn start(&mut self) -> Result<()> {
        match self.state {
            State::Created => return Err(Error::new(libc::ENODEV, "Device must be connected")),
            State::Started => return Ok(()),
            State::Connected => {}
        }
        if self.num_poll_queues > 0 && !self.info.as_ref().is_some_and(|i| i.supports_poll_queues) {
            return Err(Error::inval("Poll queues not supported"));
        }
        let max = self.info.as_ref().map_or(i32::MAX, |i| i.max_queues);
        if i64::from(self.num_queues) + i64::from(self.num_poll_queues) > i64::from(max) {
            return Err(Error::inval(format!(
                "num_queues + num_poll_queues must not be greater than {max}"
            )));
        }
        let mut queues = Vec::new();
        for _ in 0..self.num_queues {
            queues.push(Some(self.driver.create_queue(false)?));
        }
        let mut poll = Vec::new();
        for _ in 0..self.num_poll_queues {
            poll.push(Some(self.driver.create_queue(true)?));
        }
        self.driver.queues_created()?;
        self.queues = queues;
        self.poll_queues = poll;
        self.state = State::Started;
        Ok(())
    }

    fn slots(&mut self, poll: bool) -> &mut Slots {
        if poll {
            &mut self.poll_queues
        } else {
            &mut self.queues
        }
    }

    /// Queue `index` (regular or poll index space), if present.
    pub fn queue(&mut self, index: usize, poll: bool) -> Option<&mut Box<dyn Queue>> {
        self.slots(poll).get_mut(index).and_then(|s| s.as_mut())
    }

    /// Move queue `index` out of the instance (e.g. to a worker thread); its slot becomes free.
    pub fn take_queue(&mut self, index: usize, poll: bool) -> Option<Box<dyn Queue>> {
        self.slots(poll).get_mut(index).and_then(|s| s.take())
    }

    /// Add a queue in the started state; returns its index (lowest free slot first).
    pub fn add_queue(&mut self, poll: bool) -> Result<usize> {
        if self.state != State::Started {
            return Err(Error::new(libc::EBUSY, "Device must be started"));
        }
        if !self.driver.can_add_queues() {
            return Err(Error::new(
                libc::ENOTSUP,
                "Driver does not support dynamically adding queues",
            ));
        }
        if poll && !self.info.as_ref().is_some_and(|i| i.supports_poll_queues) {
            return Err(Error::inval("Poll queues not supported"));
        }
        let q = self.driver.create_queue(poll)?;
        let slots = self.slots(poll);
        if let Some(i) = slots.iter().position(|s| s.is_none()) {
            slots[i] = Some(q);
            Ok(i)
        } else {
            slots.push(Some(q));
            Ok(slots.len() - 1)
        }
    }

    /// Remove (drop) queue `index`.
    pub fn remove_queue(&mut self, index: usize, poll: bool) -> Result<()> {
        match self.slots(poll).get_mut(index) {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => Err(Error::new(
                libc::ENOENT,
                format!("no queue with index {index}"),
            )),
        }
    }

    /// Allocate a region (connected or started); the instance frees it on drop if the caller
    /// doesn't.
    pub fn alloc_mem_region(&mut self, len: usize) -> Result<MemRegion> {
        let info = self.need_connected()?;
        let a = info.mem_region_alignment.max(1);
        if !(len as u64).is_multiple_of(a) {
            return Err(Error::inval(format!(
                "len {len} violates mem-region-alignment {a}"
            )));
        }
        let r = MemRegion::alloc(len)?;
        self.allocated.push(r);
        Ok(r)
    }

    /// Free a region from [`Blkio::alloc_mem_region`]. Unknown or still-mapped regions are
    /// refused (libblkio aborts the process instead).
    pub fn free_mem_region(&mut self, region: &MemRegion) -> Result<()> {
        if self.mapped.contains(region) {
            return Err(Error::new(libc::EBUSY, "memory region is still mapped"));
        }
        let Some(i) = self.allocated.iter().position(|r| r == region) else {
            return Err(Error::inval(
                "memory region was not allocated by this instance",
            ));
        };
        let r = self.allocated.swap_remove(i);
        // SAFETY: `r` came from `MemRegion::alloc` and is removed from our list, so freed once;
        // it is not mapped, so no driver uses it.
        unsafe { r.free() };
        Ok(())
    }

    /// Make a region known to the driver (started state).
    pub fn map_mem_region(&mut self, region: &MemRegion) -> Result<()> {
        let a = self.need_connected()?.mem_region_alignment.max(1);
        if !(region.addr as u64).is_multiple_of(a) {
            return Err(Error::inval(format!(
                "addr {:#x} violates mem-region-alignment {a}",
                region.addr as u64
            )));
        }
        if !(region.len as u64).is_multiple_of(a) {
            return Err(Error::inval(format!(
                "len {:#x} violates mem-region-alignment {a}",
                region.len
            )));
        }
        if self.state != State::Started {
            return Err(Error::new(libc::EBUSY, "Device must be started"));
        }
        if self.mapped.contains(region) {
            return Err(Error::inval("memory region already mapped"));
        }
        self.driver.map_mem_region(region)?;
        self.mapped.push(*region);
        Ok(())
    }

    /// Undo [`Blkio::map_mem_region`]; a no-op for regions not mapped.
    pub fn unmap_mem_region(&mut self, region: &MemRegion) {
        if let Some(i) = self.mapped.iter().position(|r| r == region) {
            self.mapped.swap_remove(i);
            self.driver.unmap_mem_region(region);
        }
    }
}

impl Drop for Blkio {
    fn drop(&mut self) {
        // Queues first: they may still reference regions.
        self.queues.clear();
        self.poll_queues.clear();
        for r in std::mem::take(&mut self.mapped) {
            self.driver.unmap_mem_region(&r);
        }
        for r in std::mem::take(&mut self.allocated) {
            // SAFETY: allocated by us, never freed (free removes it from the list), and every
            // queue that could use it is gone.
            unsafe { r.free() };
        }
    }
}
