//! Core semantics with a scripted fake driver: property rules, lifecycle, queue slots, regions,
//! and the shared `do_io` algorithm (ordering, min/max checks, timeout write-back, ETIME).

use snapblk_core::{
    Access, Blkio, Completion, DeviceInfo, Driver, Engine, Error, Op, PropSpec, PropType,
    PropValue, Queue, QueueCore, ReqFlags, Request, Result, State,
};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::time::Duration;

/// An engine whose requests complete only when the test says so (`ready`), or never.
#[derive(Default)]
struct Fake {
    in_flight: VecDeque<usize>,
    ready: VecDeque<Completion>,
    complete_on_submit: bool,
    /// `needs_submit` answers false (nothing to hand to the device).
    idle: bool,
    submits: usize,
}

impl Engine for Fake {
    fn in_flight(&self) -> usize {
        self.in_flight.len() + self.ready.len()
    }
    fn submit(
        &mut self,
        wait: usize,
        timeout: Option<Duration>,
        _: Option<&libc::sigset_t>,
    ) -> Result<()> {
        self.submits += 1;
        if self.complete_on_submit {
            while let Some(u) = self.in_flight.pop_front() {
                self.ready.push_back(Completion::ok(u));
            }
        }
        if wait > self.ready.len() {
            if let Some(t) = timeout {
                std::thread::sleep(t);
            }
            return Err(Error::from_errno(libc::ETIME));
        }
        Ok(())
    }
    fn needs_submit(&mut self) -> bool {
        !self.idle
    }
    fn reap(&mut self, out: &mut [Completion]) -> usize {
        let n = out.len().min(self.ready.len());
        for (o, c) in out.iter_mut().zip(self.ready.drain(..n)) {
            *o = c;
        }
        n
    }
}

struct FakeQueue {
    core: QueueCore,
    eng: Fake,
}

impl Queue for FakeQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        if let Err(m) = req.validate() {
            return self
                .core
                .complete(Completion::err(req.user_data, libc::EINVAL, m));
        }
        self.eng.in_flight.push_back(req.user_data);
    }
    fn do_io(
        &mut self,
        out: &mut [Completion],
        min: usize,
        t: Option<&mut Duration>,
        s: Option<&libc::sigset_t>,
    ) -> Result<usize> {
        self.core.do_io(&mut self.eng, out, min, t, s)
    }
    fn completion_fd(&self) -> Option<RawFd> {
        self.core.completion_fd()
    }
    fn set_completion_fd_enabled(&mut self, e: bool) {
        self.core.set_completion_fd_enabled(e)
    }
    fn is_poll(&self) -> bool {
        self.core.is_poll()
    }
    fn outstanding(&self) -> usize {
        self.core.backlog_len() + self.eng.in_flight()
    }
}

fn fq(poll: bool, complete_on_submit: bool) -> FakeQueue {
    FakeQueue {
        core: QueueCore::new(poll).unwrap(),
        eng: Fake {
            complete_on_submit,
            ..Fake::default()
        },
    }
}

fn req(ud: usize, flags: u32) -> Request {
    Request::new(Op::Flush, ud, ReqFlags(flags))
}

#[test]
fn backlog_first_then_device_and_min_checks() {
    let mut q = fq(false, true);
    // SAFETY: flush requests carry no buffers.
    unsafe {
        q.enqueue(req(1, 0));
        q.enqueue(req(2, ReqFlags::FUA.0)); // rejected at enqueue
    }
    let mut out = [Completion::default(); 4];
    assert_eq!(
        q.do_io(&mut out, 3, None, None).unwrap_err().msg,
        "min_completions is larger than total outstanding requests"
    );
    assert_eq!(
        q.do_io(&mut out[..1], 2, None, None).unwrap_err().msg,
        "min_completions must be less than or equal to max_completions"
    );
    assert_eq!(q.do_io(&mut out, 2, None, None).unwrap(), 2);
    assert_eq!((out[0].user_data, out[0].ret), (2, -libc::EINVAL));
    assert_eq!((out[1].user_data, out[1].ret), (1, 0));
    assert_eq!(q.outstanding(), 0);
}

#[test]
fn submit_skipped_only_when_the_caller_is_served_and_nothing_is_pending() {
    let mut q = fq(false, true);
    q.eng.idle = true;
    q.eng.ready.extend([Completion::ok(7), Completion::ok(8)]);
    q.eng.in_flight.push_back(9);
    let mut out = [Completion::default(); 4];
    // Two ready, one wanted: no submit (no system call on a real ring).
    assert_eq!(q.do_io(&mut out, 1, None, None).unwrap(), 2);
    assert_eq!(q.eng.submits, 0);
    // Nothing ready: even with min 0, submit runs, so completions the device holds back are
    // posted (a caller polling with min 0 would otherwise never see them).
    assert_eq!(q.do_io(&mut out, 0, None, None).unwrap(), 1);
    assert_eq!(q.eng.submits, 1);
    assert_eq!(out[0].user_data, 9);
    // Requests to hand over: submit runs although completions are ready.
    q.eng.idle = false;
    q.eng.ready.push_back(Completion::ok(10));
    assert_eq!(q.do_io(&mut out, 1, None, None).unwrap(), 1);
    assert_eq!(q.eng.submits, 2);
}

#[test]
fn max_limits_and_rest_stays() {
    let mut q = fq(false, true);
    for i in 0..5 {
        // SAFETY: no buffers.
        unsafe { q.enqueue(req(i, 0)) };
    }
    let mut out = [Completion::default(); 2];
    assert_eq!(q.do_io(&mut out, 1, None, None).unwrap(), 2);
    assert_eq!(q.outstanding(), 3);
    let mut all = [Completion::default(); 8];
    assert_eq!(q.do_io(&mut all, 3, None, None).unwrap(), 3);
    assert_eq!(
        all[..3].iter().map(|c| c.user_data).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
}

#[test]
fn etime_hands_back_completions_and_zeroes_timeout() {
    let mut q = fq(false, false);
    // SAFETY: no buffers.
    unsafe {
        q.enqueue(req(1, 8)); // bad flag: backlog
        q.enqueue(req(2, 0)); // never completes
    }
    let mut out = [Completion::default(); 2];
    let mut t = Duration::from_millis(20);
    let e = q.do_io(&mut out, 2, Some(&mut t), None).unwrap_err();
    assert_eq!(e.errno, libc::ETIME);
    assert_eq!(t, Duration::ZERO);
    // the backlog completion gathered by the failed call comes back first next time
    assert_eq!(q.do_io(&mut out, 1, None, None).unwrap(), 1);
    assert_eq!(out[0].user_data, 1);
    assert_eq!(
        out[0].error_msg().unwrap(),
        c"unsupported bits in request flags"
    );
}

#[test]
fn timeout_written_back_on_success() {
    let mut q = fq(false, true);
    // SAFETY: no buffers.
    unsafe { q.enqueue(req(1, 0)) };
    let mut out = [Completion::default(); 1];
    let mut t = Duration::from_secs(5);
    assert_eq!(q.do_io(&mut out, 1, Some(&mut t), None).unwrap(), 1);
    assert!(t <= Duration::from_secs(5) && t > Duration::from_secs(4));
}

#[test]
fn poll_queue_rejects_sigmask_and_has_no_fd() {
    let mut q = fq(true, true);
    assert!(q.completion_fd().is_none());
    // SAFETY: zeroed sigset is a valid (empty) mask.
    let m: libc::sigset_t = unsafe { std::mem::zeroed() };
    let e = q.do_io(&mut [], 0, None, Some(&m)).unwrap_err();
    assert_eq!(
        (e.errno, e.msg.as_ref()),
        (
            libc::ENOTSUP,
            "blkioq_do_io_interruptible() is not supported on poll queues"
        )
    );
}

#[test]
fn completion_fd_signals_on_backlog() {
    let mut q = fq(false, true);
    let fd = q.completion_fd().unwrap();
    // SAFETY: no buffers.
    unsafe { q.enqueue(req(1, 8)) };
    let mut v = 0u64;
    // SAFETY: 8-byte read into a u64.
    assert_eq!(unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) }, 8);
    q.set_completion_fd_enabled(false);
    // SAFETY: no buffers.
    unsafe { q.enqueue(req(2, 8)) };
    let mut out = [Completion::default(); 2];
    assert_eq!(q.do_io(&mut out, 2, None, None).unwrap(), 2);
    // SAFETY: as above.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    assert_eq!(n, -1);
}

/// A driver with one created-state and one connected-state property.
struct Dummy {
    path: String,
    entries: i32,
    fail_connect: bool,
}

const PROPS: &[PropSpec] = &[
    PropSpec::new("path", PropType::Str, Access::RwCreated, false),
    PropSpec::new("num-entries", PropType::Int, Access::RwConnected, false),
];

impl Driver for Dummy {
    fn name(&self) -> &str {
        "dummy"
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _: State) -> Result<PropValue> {
        Ok(match name {
            "path" => PropValue::Str(self.path.clone()),
            _ => PropValue::Int(self.entries),
        })
    }
    fn set_prop(&mut self, name: &str, v: PropValue, _: State) -> Result<()> {
        match (name, v) {
            ("path", PropValue::Str(s)) => self.path = s,
            ("num-entries", PropValue::Int(n)) => self.entries = n,
            _ => return Err(Error::inval("bad")),
        }
        Ok(())
    }
    fn connect(&mut self, ro: bool) -> Result<DeviceInfo> {
        if self.fail_connect {
            return Err(Error::from_errno(libc::ENOENT));
        }
        Ok(DeviceInfo {
            read_only: ro,
            mem_region_alignment: 4096,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> Result<u64> {
        Ok(1 << 20)
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        Ok(Box::new(fq(poll, true)))
    }
}

fn dummy(fail: bool) -> Blkio {
    Blkio::new(Box::new(Dummy {
        path: String::new(),
        entries: 128,
        fail_connect: fail,
    }))
}

#[test]
fn property_rules() {
    let mut b = dummy(false);
    assert_eq!(b.get_int("nope").unwrap_err().errno, libc::ENOENT);
    assert_eq!(
        b.get_int("read-only").unwrap_err().msg,
        "Property is not an int"
    );
    assert_eq!(
        b.get_u64("num-entries").unwrap_err().msg,
        "Property is not an unsigned 64-bit integer"
    );
    assert_eq!(
        b.set_u64("num-entries", 1).unwrap_err().msg,
        "Property is not an unsigned 64-bit int"
    );
    assert_eq!(b.get_u64("capacity").unwrap_err().errno, libc::ENODEV);
    assert_eq!(b.set_u64("capacity", 1).unwrap_err().errno, libc::EACCES);
    assert_eq!(b.set_str("capacity", "x").unwrap_err().errno, libc::EINVAL);
    assert_eq!(b.set_int("num-entries", 1).unwrap_err().errno, libc::ENODEV);
    assert_eq!(b.get_str("read-only").unwrap(), "false");
    assert_eq!(b.start().unwrap_err().errno, libc::ENODEV);
    b.set_str("path", "p").unwrap();
    b.set_str("read-only", "true").unwrap();
    b.connect().unwrap();
    assert!(b.get_bool("read-only").unwrap());
    assert_eq!(
        b.set_str("path", "q").unwrap_err().msg,
        "Cannot set property in connected state"
    );
    assert_eq!(
        b.set_int("num-queues", -1).unwrap_err().msg,
        "num_queues must be equal to or greater than 0"
    );
    b.set_int("num-queues", 2).unwrap();
    b.set_str("num-entries", "+64").unwrap();
    assert_eq!(b.get_int("num-entries").unwrap(), 64);
    b.start().unwrap();
    assert_eq!(
        b.set_int("num-entries", 1).unwrap_err().msg,
        "Cannot set property in started state"
    );
    assert_eq!(b.connect().unwrap_err().errno, libc::EBUSY);
    assert_eq!(b.state(), State::Started);
}

#[test]
fn failed_connect_stays_created() {
    let mut b = dummy(true);
    assert_eq!(b.connect().unwrap_err().errno, libc::ENOENT);
    assert_eq!(b.state(), State::Created);
}

#[test]
fn queue_slots_and_regions() {
    let mut b = dummy(false);
    b.connect().unwrap();
    b.set_int("num-queues", 3).unwrap();
    assert_eq!(b.add_queue(false).unwrap_err().errno, libc::EBUSY);
    assert_eq!(
        b.alloc_mem_region(4097).unwrap_err().msg,
        "len 4097 violates mem-region-alignment 4096"
    );
    let r = b.alloc_mem_region(8192).unwrap();
    assert_eq!(b.map_mem_region(&r).unwrap_err().errno, libc::EBUSY);
    b.start().unwrap();
    assert!(b.queue(2, false).is_some() && b.queue(3, false).is_none());
    b.remove_queue(1, false).unwrap();
    assert_eq!(
        b.remove_queue(1, false).unwrap_err().msg,
        "no queue with index 1"
    );
    assert_eq!(b.add_queue(false).unwrap(), 1);
    assert_eq!(
        b.add_queue(true).unwrap_err().msg,
        "Poll queues not supported"
    );
    b.map_mem_region(&r).unwrap();
    assert_eq!(
        b.map_mem_region(&r).unwrap_err().msg,
        "memory region already mapped"
    );
    assert_eq!(b.free_mem_region(&r).unwrap_err().errno, libc::EBUSY);
    b.unmap_mem_region(&r);
    b.free_mem_region(&r).unwrap();
    assert!(b.free_mem_region(&r).is_err());
    let _leak = b.alloc_mem_region(4096).unwrap(); // freed by drop
}

/// A driver whose device limits its queues and needs memory regions (as virtio-blk does).
struct Limited;

impl Driver for Limited {
    fn name(&self) -> &str {
        "limited"
    }
    fn get_prop(&self, _: &str, _: State) -> Result<PropValue> {
        Err(Error::new(libc::ENOENT, "Unknown property name"))
    }
    fn set_prop(&mut self, _: &str, _: PropValue, _: State) -> Result<()> {
        Err(Error::new(libc::ENOENT, "Unknown property name"))
    }
    fn connect(&mut self, ro: bool) -> Result<DeviceInfo> {
        Ok(DeviceInfo {
            read_only: ro,
            max_queues: 2,
            needs_mem_regions: true,
            needs_mem_region_fd: true,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> Result<u64> {
        Ok(1 << 20)
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        Ok(Box::new(fq(poll, true)))
    }
}

#[test]
fn device_limits_and_region_needs_come_from_the_driver() {
    let mut b = dummy(false);
    b.connect().unwrap();
    assert_eq!(b.get_int("max-queues").unwrap(), i32::MAX);
    assert!(!b.get_bool("needs-mem-regions").unwrap());
    assert!(!b.get_bool("needs-mem-region-fd").unwrap());
    let mut b = Blkio::new(Box::new(Limited));
    b.connect().unwrap();
    assert_eq!(b.get_int("max-queues").unwrap(), 2);
    assert!(b.get_bool("needs-mem-regions").unwrap());
    assert!(b.get_bool("needs-mem-region-fd").unwrap());
    b.set_int("num-queues", 3).unwrap();
    let e = b.start().unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (
            libc::EINVAL,
            "num_queues + num_poll_queues must not be greater than 2"
        )
    );
    assert_eq!(b.state(), State::Connected);
    b.set_int("num-queues", 2).unwrap();
    b.start().unwrap();
    assert!(b.queue(1, false).is_some());
}

/// A driver shaped like libblkio's virtio-blk ones: common properties readable when created.
struct Shaped;

impl Driver for Shaped {
    fn name(&self) -> &str {
        "shaped"
    }
    fn get_prop(&self, _: &str, _: State) -> Result<PropValue> {
        Err(Error::new(libc::ENOENT, "Unknown property name"))
    }
    fn set_prop(&mut self, _: &str, _: PropValue, _: State) -> Result<()> {
        Err(Error::new(libc::ENOENT, "Unknown property name"))
    }
    fn created_info(&self) -> Option<DeviceInfo> {
        Some(DeviceInfo {
            request_alignment: 512,
            needs_mem_regions: true,
            needs_mem_region_fd: true,
            may_pin_mem_regions: true,
            supports_poll_queues: true,
            ..DeviceInfo::default()
        })
    }
    fn connect(&mut self, ro: bool) -> Result<DeviceInfo> {
        Ok(DeviceInfo {
            read_only: ro,
            request_alignment: 4096,
            max_queues: 2,
            max_mem_regions: 32,
            ..self.created_info().unwrap_or_default()
        })
    }
    fn capacity(&self) -> Result<u64> {
        Ok(1 << 20)
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        Ok(Box::new(fq(poll, true)))
    }
}

#[test]
fn driver_shaped_common_properties() {
    let mut b = Blkio::new(Box::new(Shaped));
    // Created: defaults from the driver; only these three need a connection.
    for p in ["capacity", "max-queues", "max-mem-regions"] {
        let e = b.get_str(p).unwrap_err();
        assert_eq!(
            (e.errno, e.msg.to_string()),
            (libc::ENODEV, "Device must be connected".to_string()),
            "{p}"
        );
    }
    assert_eq!(b.get_int("request-alignment").unwrap(), 512);
    assert!(b.get_bool("needs-mem-regions").unwrap());
    assert!(b.get_bool("needs-mem-region-fd").unwrap());
    assert!(b.get_bool("may-pin-mem-regions").unwrap());
    assert!(b.get_bool("supports-poll-queues").unwrap());
    assert_eq!(b.get_int("max-transfer").unwrap(), 0);
    b.set_bool("read-only", true).unwrap();
    assert!(b.get_bool("read-only").unwrap());
    b.connect().unwrap();
    assert_eq!(b.get_int("request-alignment").unwrap(), 4096);
    assert_eq!(b.get_int("max-queues").unwrap(), 2);
    assert_eq!(b.get_u64("max-mem-regions").unwrap(), 32);
    assert!(b.get_bool("read-only").unwrap());
    b.set_int("num-queues", 3).unwrap();
    assert_eq!(
        b.start().unwrap_err().msg,
        "num_queues + num_poll_queues must not be greater than 2"
    );
}

#[test]
fn io_uring_shaped_drivers_keep_their_created_rules() {
    let b = dummy(false);
    for p in ["request-alignment", "max-transfer", "mem-region-alignment"] {
        assert_eq!(b.get_str(p).unwrap_err().errno, libc::ENODEV, "{p}");
    }
    assert_eq!(b.get_int("max-queues").unwrap(), i32::MAX);
    assert_eq!(b.get_u64("max-mem-regions").unwrap(), u64::MAX);
    assert!(!b.get_bool("needs-mem-regions").unwrap());
    assert!(!b.get_bool("may-pin-mem-regions").unwrap());
    assert!(!b.get_bool("supports-poll-queues").unwrap());
}

#[test]
fn a_queue_core_on_a_driver_eventfd_starts_silent_when_asked() {
    let efd = snapblk_core::sys::EventFd::new().unwrap();
    let mut core = QueueCore::with_eventfd(efd, false);
    core.complete(Completion::ok(1));
    let fd = core.completion_fd().unwrap();
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    assert_eq!(n, -1, "notifications are off: the fd stays quiet");
    core.set_completion_fd_enabled(true);
    core.complete(Completion::ok(2));
    core.notify();
    // SAFETY: as above.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    assert_eq!(n, 8);
}

#[test]
fn resize_needs_a_connected_writable_device_and_a_driver_that_can() {
    let mut b = dummy(false);
    assert_eq!(b.resize(4096).unwrap_err().errno, libc::ENODEV);
    assert!(!b.can_resize(), "not connected");
    b.connect().unwrap();
    // The Driver trait's default: the driver cannot resize its device, and says so ahead.
    assert!(!b.can_resize());
    let e = b.resize(4096).unwrap_err();
    assert_eq!(e.errno, libc::ENOTSUP);
    assert!(e.to_string().contains("dummy driver cannot resize"), "{e}");
    let mut ro = dummy(false);
    ro.set_bool("read-only", true).unwrap();
    ro.connect().unwrap();
    assert_eq!(ro.resize(4096).unwrap_err().errno, libc::EROFS);
}
