//! One ublk queue thread: a task per tag fetches requests from the kernel and serves them through
//! the device queue (generic path) or the read planner (zero-copy path).

use crate::DataPath;
use crate::bridge::CoreQueue;
use crate::plan::{ReadPlanner, Segment, validate};
use io_uring::{opcode, squeue, types};
use libublk::helpers::IoBuf;
use libublk::io::{BufDesc, UblkDev, UblkIOCtx, UblkQueue};
use libublk::uring_async::{UblkUringOpFuture, ublk_submit_sqe_async};
use libublk::{UblkError, UblkUringData, sys};
use snapblk_core::{Op, Queue, ReqFlags, Request};
use std::cell::RefCell;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Fixed-file slots in every queue ring: 0 is /dev/ublkcN (libublk), then /dev/zero, then the
/// planner's files.
pub(crate) const ZERO_FILE: u32 = 1;
pub(crate) const FIRST_PLAN_FILE: u32 = 2;

/// Everything a queue thread needs; shared by all queue threads.
pub(crate) struct Shared {
    pub queues: std::sync::Mutex<Vec<Option<Box<dyn Queue>>>>,
    pub planner: Option<Arc<dyn ReadPlanner>>,
    pub nplan_files: usize,
    pub path: DataPath,
    pub max_io: u32,
}

struct Ctx<'a> {
    q: &'a UblkQueue<'a>,
    core: &'a CoreQueue,
    shared: &'a Shared,
    cdev: RawFd,
}

/// Body of the queue thread `qid`.
pub(crate) fn queue_thread(qid: u16, dev: &UblkDev, shared: &Shared) {
    let Some(devq) = shared
        .queues
        .lock()
        .ok()
        .and_then(|mut v| v.get_mut(usize::from(qid)).and_then(Option::take))
    else {
        eprintln!("snapblk-ublk: no device queue for ublk queue {qid}");
        return;
    };
    let depth = dev.dev_info.queue_depth;
    let core = CoreQueue::new(devq, usize::from(depth));
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("snapblk-ublk: queue {qid} setup failed: {e}");
            return;
        }
    };
    let ctx = Ctx {
        q: &q,
        core: &core,
        shared,
        cdev: dev.tgt.fds[0],
    };
    let exe = smol::LocalExecutor::new();
    let mut tasks = Vec::new();
    for tag in q.tags() {
        let ctx = &ctx;
        tasks.push(exe.spawn(async move {
            match io_task(ctx, tag).await {
                Err(UblkError::QueueIsDown) | Ok(()) => {}
                Err(e) => eprintln!("snapblk-ublk: queue {qid} tag {tag}: {e}"),
            }
        }));
    }
    // Wakes the loop when the device queue completes something while the ring sleeps.
    let _waker = exe.spawn(completion_watch(core.completion_fd()));
    let run_ops = || {
        loop {
            while exe.try_tick() {}
            if core.pump() == 0 {
                break;
            }
        }
    };
    let done = || tasks.iter().all(|t| t.is_finished());
    smol::block_on(async {
        if let Err(e) = libublk::wait_and_handle_io_events(&q, Some(20), run_ops, done).await {
            eprintln!("snapblk-ublk: queue {qid} event loop: {e}");
        }
    });
}

/// Poll the device queue's completion eventfd through the ublk ring; each wake-up clears it and
/// lets the event loop run `pump`. Without an eventfd, tick every millisecond.
async fn completion_watch(fd: Option<RawFd>) {
    loop {
        let r = match fd {
            Some(fd) => {
                let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build();
                ublk_submit_sqe_async(sqe, UblkUringData::Target as u64).await
            }
            None => {
                let ts = Box::new(types::Timespec::new().nsec(1_000_000));
                let sqe = opcode::Timeout::new(&*ts).build();
                let r = ublk_submit_sqe_async(sqe, UblkUringData::Target as u64).await;
                // The timespec must outlive the SQE; leaking 16 bytes per tick is not an option,
                // so keep it until the completion arrived (it has: we awaited it).
                drop(ts);
                r
            }
        };
        match (r, fd) {
            (Ok(_), Some(fd)) => clear_eventfd(fd),
            (Ok(_), None) => {}
            (Err(_), _) => return,
        }
    }
}

fn clear_eventfd(fd: RawFd) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    if unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLIN != 0 {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a u64; the fd was just reported readable, so this does not
        // block (only this thread consumes it).
        unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    }
}

async fn io_task(ctx: &Ctx<'_>, tag: u16) -> Result<(), UblkError> {
    let q = ctx.q;
    let max_io = ctx.shared.max_io as usize;
    // Copy mode: the kernel copies request data to/from this per-tag buffer.
    let buf = match ctx.shared.path {
        DataPath::Copy => Some(IoBuf::<u8>::new(max_io)),
        _ => None,
    };
    // User copy / zero copy: staging buffer for the generic path, allocated on first use.
    let bounce: RefCell<Option<IoBuf<u8>>> = RefCell::new(None);
    let reg = sys::ublk_auto_buf_reg {
        index: tag,
        ..Default::default()
    };
    let desc = match (&ctx.shared.path, &buf) {
        (DataPath::Copy, Some(b)) => BufDesc::Slice(b.as_slice()),
        (DataPath::ZeroCopy, _) => BufDesc::AutoReg(reg),
        _ => BufDesc::Slice(&[]),
    };
    q.submit_io_prep_cmd(tag, desc.clone(), 0, buf.as_ref())
        .await?;
    loop {
        let res = handle(ctx, tag, buf.as_ref(), &bounce).await;
        q.submit_io_commit_cmd(tag, desc.clone(), res).await?;
    }
}

fn bounce_ptr(b: &RefCell<Option<IoBuf<u8>>>, size: usize) -> *mut u8 {
    let mut b = b.borrow_mut();
    b.get_or_insert_with(|| IoBuf::<u8>::new(size)).as_mut_ptr()
}

async fn core_op(ctx: &Ctx<'_>, tag: u16, op: Op, flags: ReqFlags) -> i32 {
    // SAFETY: buffers in `op` are the tag's own (copy buffer or bounce buffer), used by nothing
    // else until this await returns.
    unsafe { ctx.core.submit(tag, Request::new(op, 0, flags)) }.await
}

async fn handle(
    ctx: &Ctx<'_>,
    tag: u16,
    buf: Option<&IoBuf<u8>>,
    bounce: &RefCell<Option<IoBuf<u8>>>,
) -> i32 {
    let iod = ctx.q.get_iod(tag);
    let op = iod.op_flags & 0xff;
    let off = iod.start_sector << 9;
    let len = iod.nr_sectors << 9;
    let max = ctx.shared.max_io;
    if len > max && matches!(op, sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE) {
        return -libc::EINVAL;
    }
    let fua = if iod.op_flags & sys::UBLK_IO_F_FUA != 0 {
        ReqFlags::FUA
    } else {
        ReqFlags::NONE
    };
    let done = |r: i32| if r < 0 { r } else { len as i32 };
    match (op, ctx.shared.path) {
        (sys::UBLK_IO_OP_READ, DataPath::Copy) => {
            let Some(b) = buf else { return -libc::EIO };
            done(
                core_op(
                    ctx,
                    tag,
                    Op::Read {
                        offset: off,
                        buf: b.as_mut_ptr(),
                        len: len as usize,
                    },
                    ReqFlags::NONE,
                )
                .await,
            )
        }
        (sys::UBLK_IO_OP_WRITE, DataPath::Copy) => {
            let Some(b) = buf else { return -libc::EIO };
            done(
                core_op(
                    ctx,
                    tag,
                    Op::Write {
                        offset: off,
                        buf: b.as_mut_ptr(),
                        len: len as usize,
                    },
                    fua,
                )
                .await,
            )
        }
        (sys::UBLK_IO_OP_READ, DataPath::ZeroCopy) if ctx.shared.planner.is_some() => {
            done(zc_read(ctx, tag, off, len, bounce).await)
        }
        (sys::UBLK_IO_OP_READ, _) => done(read_via_device(ctx, tag, off, len, 0, bounce).await),
        (sys::UBLK_IO_OP_WRITE, _) => {
            let p = bounce_ptr(bounce, max as usize);
            let r = user_copy(ctx, tag, p, len, 0, false);
            if r < 0 {
                return r;
            }
            done(
                core_op(
                    ctx,
                    tag,
                    Op::Write {
                        offset: off,
                        buf: p,
                        len: len as usize,
                    },
                    fua,
                )
                .await,
            )
        }
        (sys::UBLK_IO_OP_FLUSH, _) => core_op(ctx, tag, Op::Flush, ReqFlags::NONE).await,
        (sys::UBLK_IO_OP_DISCARD, _) => {
            core_op(
                ctx,
                tag,
                Op::Discard {
                    offset: off,
                    len: u64::from(len),
                },
                ReqFlags::NONE,
            )
            .await
        }
        (sys::UBLK_IO_OP_WRITE_ZEROES, _) => {
            let f = if iod.op_flags & sys::UBLK_IO_F_NOUNMAP != 0 {
                ReqFlags::NO_UNMAP
            } else {
                ReqFlags::NONE
            };
            core_op(
                ctx,
                tag,
                Op::WriteZeroes {
                    offset: off,
                    len: u64::from(len),
                },
                f,
            )
            .await
        }
        _ => -libc::EOPNOTSUPP,
    }
}

/// Generic read for user copy / zero copy: device queue into the bounce buffer, then one copy
/// into the request at `req_off`.
async fn read_via_device(
    ctx: &Ctx<'_>,
    tag: u16,
    off: u64,
    len: u32,
    req_off: u32,
    bounce: &RefCell<Option<IoBuf<u8>>>,
) -> i32 {
    let p = bounce_ptr(bounce, ctx.shared.max_io as usize);
    let r = core_op(
        ctx,
        tag,
        Op::Read {
            offset: off,
            buf: p,
            len: len as usize,
        },
        ReqFlags::NONE,
    )
    .await;
    if r < 0 {
        return r;
    }
    user_copy(ctx, tag, p, len, req_off, true)
}

/// Copy between `p` and the request's pages through /dev/ublkcN (UBLK_F_USER_COPY semantics,
/// also offered by zero-copy devices). `to_req`: write into the request (a READ's data).
fn user_copy(ctx: &Ctx<'_>, tag: u16, p: *mut u8, len: u32, req_off: u32, to_req: bool) -> i32 {
    let mut pos = UblkIOCtx::ublk_user_copy_pos(ctx.q.get_qid(), tag, req_off);
    let mut done = 0usize;
    let len = len as usize;
    while done < len {
        // SAFETY: p points to the tag's bounce buffer of max_io >= len bytes, owned by this task.
        let r = unsafe {
            let bp = p.add(done).cast();
            if to_req {
                libc::pwrite(ctx.cdev, bp, len - done, pos as libc::off_t)
            } else {
                libc::pread(ctx.cdev, bp, len - done, pos as libc::off_t)
            }
        };
        if r < 0 {
            return -std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
        }
        if r == 0 {
            return -libc::EIO;
        }
        done += r as usize;
        pos += r as u64;
    }
    0
}

/// Zero-copy read: file segments are read by the kernel straight into the request's pages
/// (auto-registered buffer `tag`), zero segments from /dev/zero the same way; device segments
/// take the generic path into their slice of the request.
async fn zc_read(
    ctx: &Ctx<'_>,
    tag: u16,
    off: u64,
    len: u32,
    bounce: &RefCell<Option<IoBuf<u8>>>,
) -> i32 {
    let Some(planner) = ctx.shared.planner.as_ref() else {
        return -libc::EIO;
    };
    let mut plan = Vec::new();
    if let Err(e) = planner.plan(off, len, &mut plan) {
        return -e.errno;
    }
    if !validate(&plan, len, ctx.shared.nplan_files) {
        return -libc::EIO;
    }
    // Issue every kernel-side segment at once, then the device segments, then wait.
    let mut futs = Vec::new();
    let mut boff = 0u32;
    for s in &plan {
        match *s {
            Segment::File {
                file,
                offset,
                len: l,
            } => {
                futs.push((
                    fixed_read(ctx, tag, FIRST_PLAN_FILE + u32::from(file), offset, boff, l),
                    l,
                    boff,
                ));
            }
            Segment::Zero { len: l } => {
                futs.push((fixed_read(ctx, tag, ZERO_FILE, 0, boff, l), l, boff))
            }
            Segment::Device { .. } => {}
        }
        boff += s.len();
    }
    let mut res = 0;
    boff = 0;
    for s in &plan {
        if let Segment::Device { offset, len: l } = *s {
            let r = read_via_device(ctx, tag, offset, l, boff, bounce).await;
            if r < 0 {
                res = r;
            }
        }
        boff += s.len();
    }
    for (f, l, b) in futs {
        let r = f.await;
        if r < 0 {
            res = r;
        } else if (r as u32) < l {
            // Short read: past the end of the file (reads as zeros) or a partial read; finish it.
            let r2 = finish_short(ctx, tag, b + r as u32, l - r as u32, &plan, b).await;
            if r2 < 0 {
                res = r2;
            }
        }
    }
    res
}

/// Complete a short kernel-side read of the segment starting at request offset `seg_boff`.
async fn finish_short(
    ctx: &Ctx<'_>,
    tag: u16,
    mut boff: u32,
    mut left: u32,
    plan: &[Segment],
    seg_boff: u32,
) -> i32 {
    let mut o = 0u32;
    let mut seg = None;
    for s in plan {
        if o == seg_boff {
            seg = Some(*s);
            break;
        }
        o += s.len();
    }
    while left > 0 {
        let r = match seg {
            Some(Segment::File { file, offset, .. }) => {
                let foff = offset + u64::from(boff - seg_boff);
                fixed_read(
                    ctx,
                    tag,
                    FIRST_PLAN_FILE + u32::from(file),
                    foff,
                    boff,
                    left,
                )
                .await
            }
            _ => fixed_read(ctx, tag, ZERO_FILE, 0, boff, left).await,
        };
        if r < 0 {
            return r;
        }
        if r == 0 {
            // End of file: the rest reads as zeros.
            seg = None;
            continue;
        }
        boff += r as u32;
        left -= r as u32;
    }
    0
}

/// io_uring READ_FIXED from fixed file `file` at `foff` into the request buffer (registered at
/// index `tag` by the kernel) at offset `boff`. With a kernel (bvec) buffer the "address" is the
/// offset inside the buffer.
fn fixed_read(
    ctx: &Ctx<'_>,
    tag: u16,
    file: u32,
    foff: u64,
    boff: u32,
    len: u32,
) -> UblkUringOpFuture {
    let sqe = opcode::ReadFixed::new(types::Fixed(file), boff as usize as *mut u8, len, tag)
        .offset(foff)
        .build()
        .flags(squeue::Flags::FIXED_FILE);
    ctx.q.ublk_submit_sqe(sqe)
}
