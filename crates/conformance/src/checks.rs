//! The checks and the runner behind [`crate::run`].

use crate::suite::{
    Mem, Props, Res, SHOWN, Stop, Suite, align_up, describe, diff, pass, pattern, read_eventfd,
    submit, wait,
};
use crate::{DataModel, Options, Outcome, Report};
use snapblk_core::{Blkio, Completion, MemRegion, Op, ReqFlags, Request, State};
use std::time::Duration;

// ---- the checks -------------------------------------------------------------------------------

fn properties(s: &mut Suite) -> Res {
    let p = &s.p;
    let mut bad = Vec::new();
    if !p.request_alignment.is_power_of_two() {
        bad.push("request-alignment is not a power of two");
    }
    if !p.mem_region_alignment.is_power_of_two() {
        bad.push("mem-region-alignment is not a power of two");
    }
    if p.buf_alignment == 0 || p.optimal_buf_alignment == 0 {
        bad.push("buf-alignment and optimal-buf-alignment must be at least 1");
    }
    if p.max_segments == 0 {
        bad.push("max-segments must be at least 1");
    }
    if p.request_alignment > 0 && !p.optimal_io_size.is_multiple_of(p.request_alignment) {
        bad.push("optimal-io-size is not a multiple of request-alignment");
    }
    if p.request_alignment > 0 && !p.max_transfer.is_multiple_of(p.request_alignment) {
        bad.push("max-transfer is not a multiple of request-alignment");
    }
    if p.num_queues > p.max_queues {
        bad.push("num-queues is larger than max-queues");
    }
    ensure!(
        bad.is_empty(),
        "{} [{}]",
        bad.join("; "),
        p.show(&[
            "request-alignment",
            "mem-region-alignment",
            "buf-alignment",
            "optimal-buf-alignment",
            "optimal-io-size",
            "max-transfer",
            "max-segments",
            "num-queues",
            "max-queues"
        ])
    );
    pass()
}

fn expectations(s: &mut Suite) -> Res {
    let e = s.opts.expect.clone();
    let p = &s.p;
    let mut checked = Vec::new();
    let mut bad = Vec::new();
    let mut cmp = |name: &'static str, want: Option<String>| {
        if let Some(w) = want {
            checked.push(name);
            let got = p.show(&[name]);
            if got != format!("{name}={w}") {
                bad.push(format!("expected {name}={w}, device says {got:?}"));
            }
        }
    };
    cmp("capacity", e.capacity.map(|v| v.to_string()));
    cmp("direct", e.direct.map(|v| v.to_string()));
    cmp("can-grow", e.can_grow.map(|v| v.to_string()));
    cmp("read-only", e.read_only.map(|v| v.to_string()));
    ensure!(bad.is_empty(), "{}", bad.join("; "));
    if checked.is_empty() {
        return Ok(Outcome::Skip(
            "the caller expects no property values".into(),
        ));
    }
    Ok(Outcome::Pass(format!("checked {}", checked.join(", "))))
}

/// Allocate and map the suite's buffers (a failure here stops the suite).
fn setup(s: &mut Suite) -> Res {
    let props = &[
        "mem-region-alignment",
        "needs-mem-regions",
        "needs-mem-region-fd",
    ];
    let mra = s.p.mem_region_alignment.max(1);
    s.rlen = align_up(Suite::NEEDED * s.u as u64, mra) as usize;
    let mapped = match s.b.alloc_mem_region(s.rlen) {
        Ok(r) => r,
        Err(e) => {
            return Err(Stop::Fatal(format!(
                "alloc_mem_region({}) failed: {e} [{}]",
                s.rlen,
                s.p.show(props)
            )));
        }
    };
    s.mapped = Some(mapped);
    if let Err(e) = s.b.map_mem_region(&mapped) {
        return Err(Stop::Fatal(format!(
            "map_mem_region failed: {e} [{}]",
            s.p.show(props)
        )));
    }
    match s.b.alloc_mem_region(s.rlen) {
        Ok(r) => s.unmapped = Some(r),
        Err(e) => return Err(Stop::Fatal(format!("second alloc_mem_region failed: {e}"))),
    }
    match MemRegion::alloc_private(s.rlen) {
        Ok(r) => s.plain = Some(r),
        Err(e) => return Err(Stop::Fatal(format!("private memory: {e}"))),
    }
    if s.p.needs_mem_region_fd {
        ensure!(
            mapped.fd >= 0,
            "alloc_mem_region gave a region without fd [{}]",
            s.p.show(props)
        );
    }
    if mra > 1 {
        match s.b.alloc_mem_region(s.rlen + mra as usize / 2) {
            Ok(r) => {
                let _ = s.b.free_mem_region(&r);
                fail!(
                    "a region length that is not a multiple of mem-region-alignment was accepted [{}]",
                    s.p.show(props)
                );
            }
            Err(e) => ensure!(
                e.errno == libc::EINVAL,
                "a region length not a multiple of mem-region-alignment: expected EINVAL, got {e} [{}]",
                s.p.show(props)
            ),
        }
    }
    if s.p.needs_mem_region_fd
        && let Some(plain) = s.plain
        && s.b.map_mem_region(&plain).is_ok()
    {
        s.b.unmap_mem_region(&plain);
        fail!("a region without fd was mapped [{}]", s.p.show(props));
    }
    pass()
}

fn read_write(s: &mut Suite, m: Mem) -> Res {
    if m == Mem::Plain && s.p.needs_mem_regions {
        return Ok(Outcome::Skip(format!(
            "{}: plain buffers are refused (see unmapped-buffers)",
            s.p.show(&["needs-mem-regions"])
        )));
    }
    let props: &[&str] = &[
        "needs-mem-regions",
        "request-alignment",
        "buf-alignment",
        "max-transfer",
        "supports-fua-natively",
    ];
    let len = s.dlen();
    let (a, a2) = (s.off(Suite::A), s.off(Suite::A2));
    if s.p.read_only {
        // Two reads of the same range agree (the write checks cannot run).
        s.fill(m, 0, &vec![0xA5; len]);
        s.fill(m, len, &vec![0x5A; len]);
        let c = s.rw(false, a, m, 0, len)?;
        s.ok(c, "read", props)?;
        let c = s.rw(false, a, m, len, len)?;
        s.ok(c, "second read", props)?;
        // SAFETY: no request in flight.
        let first = unsafe { s.mem(m) }[..len].to_vec();
        s.same(m, len, &first, "two reads of one range differ", props)?;
        s.at_a = first;
        return pass();
    }
    let (p1, p2) = (pattern(len, 1), pattern(len, 2));
    s.fill(m, 0, &p1);
    s.fill(m, len, &p2);
    let c = s.rw(true, a, m, 0, len)?;
    s.ok(c, &format!("write of {len} bytes at {a}"), props)?;
    let c = s.rw_flags(true, a2, m, len, len, ReqFlags::FUA)?;
    s.ok(c, &format!("FUA write of {len} bytes at {a2}"), props)?;
    s.fill(m, 0, &vec![0; 2 * len]);
    let c = s.rw(false, a, m, 0, len)?;
    s.ok(c, &format!("read at {a}"), props)?;
    let c = s.rw(false, a2, m, len, len)?;
    s.ok(c, &format!("read at {a2}"), props)?;
    let (w1, w2) = (s.stored(&p1), s.stored(&p2));
    s.same(
        m,
        0,
        &w1,
        &format!("read at {a} after writes at {a} and {a2}"),
        props,
    )?;
    s.same(
        m,
        len,
        &w2,
        &format!("read at {a2} after writes at {a} and {a2}"),
        props,
    )?;
    s.at_a = w1;
    pass()
}

fn write_refusal(s: &mut Suite) -> Res {
    let props = &["read-only"];
    let u = s.u;
    let a = s.off(Suite::A);
    let before = s.reference(s.dlen())?;
    let iov = s.iovecs(Mem::Mapped, &[0], u);
    let c = s.rw(true, a, Mem::Mapped, 0, u)?;
    s.want_err(c, libc::EBADF, "write on a read-only device", props)?;
    let c = s.iov_io(true, a, &iov, ReqFlags::NONE, 2)?;
    s.want_err(c, libc::EBADF, "writev on a read-only device", props)?;
    let c = s.io(
        Op::WriteZeroes {
            offset: a,
            len: u as u64,
        },
        ReqFlags::NONE,
        3,
    )?;
    s.want_err(c, libc::EBADF, "write-zeroes on a read-only device", props)?;
    let c = s.io(
        Op::Discard {
            offset: a,
            len: u as u64,
        },
        ReqFlags::NONE,
        4,
    )?;
    s.want_err(c, libc::EBADF, "discard on a read-only device", props)?;
    let len = before.len();
    let c = s.rw(false, a, Mem::Mapped, 0, len)?;
    s.ok(c, "read after refused writes", props)?;
    s.same(
        Mem::Mapped,
        0,
        &before,
        "data changed by refused writes",
        props,
    )?;
    pass()
}

fn unmapped_buffers(s: &mut Suite) -> Res {
    let props: &[&str] = &["needs-mem-regions", "mem-region-alignment", "buf-alignment"];
    let len = s.dlen();
    let a = s.off(Suite::A);
    let want = s.reference(len)?;
    if !s.p.needs_mem_regions {
        // A region that was allocated but never mapped works like any other memory.
        let c = s.rw(false, a, Mem::Unmapped, 0, len)?;
        s.ok(c, "read into an unmapped region", props)?;
        s.same(
            Mem::Unmapped,
            0,
            &want,
            "read into an unmapped region",
            props,
        )?;
        return Ok(Outcome::Pass(
            "needs-mem-regions=false: unmapped memory works".into(),
        ));
    }
    let u = s.u;
    for (what, m) in [
        ("an unmapped region", Mem::Unmapped),
        ("plain memory", Mem::Plain),
    ] {
        let what = format!("read into {what}");
        let c = s
            .rw(false, a, m, 0, len)
            .map_err(|e| s.ctx(e, &what, props))?;
        s.want_err(c, libc::EFAULT, &what, props)?;
    }
    // One iovec inside the mapped region, one outside.
    let mut iov = s.iovecs(Mem::Mapped, &[0], u);
    iov.extend(s.iovecs(Mem::Unmapped, &[0], u));
    let c = s.iov_io(false, a, &iov, ReqFlags::NONE, 2)?;
    s.want_err(
        c,
        libc::EFAULT,
        "readv with one iovec outside the regions",
        props,
    )?;
    // A buffer that starts inside the mapped region and runs past its end.
    let half = u / 2;
    if s.p.buf_alignment as usize <= half {
        let at = s.rlen - half;
        let c = s.rw(false, a, Mem::Mapped, at, u)?;
        s.want_err(
            c,
            libc::EFAULT,
            "read into a buffer running past the region's end",
            props,
        )?;
    }
    if !s.p.read_only {
        s.fill(Mem::Unmapped, 0, &pattern(len, 77));
        let c = s.rw(true, a, Mem::Unmapped, 0, len)?;
        s.want_err(c, libc::EFAULT, "write from an unmapped region", props)?;
        let c = s.rw(false, a, Mem::Mapped, 0, len)?;
        s.ok(c, "read after the refused write", props)?;
        s.same(
            Mem::Mapped,
            0,
            &want,
            "the refused write changed the data",
            props,
        )?;
    }
    Ok(Outcome::Pass(
        "needs-mem-regions=true: buffers outside the regions fail with EFAULT".into(),
    ))
}

fn vectored(s: &mut Suite, m: Mem) -> Res {
    if m == Mem::Plain && s.p.needs_mem_regions {
        return Ok(Outcome::Skip(format!(
            "{}: plain buffers are refused",
            s.p.show(&["needs-mem-regions"])
        )));
    }
    let props: &[&str] = &[
        "max-segments",
        "max-segment-len",
        "max-transfer",
        "needs-mem-regions",
    ];
    let mut seg = s.u;
    if s.p.max_segment_len > 0 && (s.p.max_segment_len as usize) < seg {
        seg = s.p.max_segment_len as usize / s.p.request_alignment.max(1) as usize
            * s.p.request_alignment.max(1) as usize;
    }
    let fits = |n: usize| s.p.max_transfer == 0 || (n * seg) as u64 <= s.p.max_transfer;
    let n3 = s.p.max_segments.clamp(1, 3);
    let mut nmax = s.p.max_segments.clamp(1, 64);
    while nmax > 1 && !fits(nmax) {
        nmax -= 1;
    }
    let (b, c_off) = (s.off(Suite::B), s.off(Suite::C));
    // Three segments (fewer if max-segments says so), FUA on the write.
    let at3: Vec<usize> = (0..n3).map(|i| i * seg).collect();
    let iov = s.iovecs(m, &at3, seg);
    let d2 = pattern(n3 * seg, 9);
    if !s.p.read_only {
        s.fill(m, 0, &d2);
        let c = s.iov_io(true, b, &iov, ReqFlags::FUA, 7)?;
        s.ok(c, &format!("writev of {n3} iovecs with FUA"), props)?;
    }
    s.fill(m, 0, &vec![0; n3 * seg]);
    let c = s.iov_io(false, b, &iov, ReqFlags::NONE, 8)?;
    s.ok(c, &format!("readv of {n3} iovecs"), props)?;
    let want = if s.p.read_only {
        let c = s.rw(false, b, m, n3 * seg, n3 * seg)?;
        s.ok(c, "read of the readv range", props)?;
        // SAFETY: no request in flight.
        let mem = unsafe { s.mem(m) };
        mem[n3 * seg..2 * n3 * seg].to_vec()
    } else {
        s.stored(&d2)
    };
    s.same(m, 0, &want, &format!("readv of {n3} iovecs"), props)?;
    // max-segments iovecs (at most 64), placed in reverse order in memory.
    let atn: Vec<usize> = (0..nmax).rev().map(|i| i * seg).collect();
    let iov = s.iovecs(m, &atn, seg);
    let dn = pattern(nmax * seg, 5);
    let mut scattered = vec![0u8; nmax * seg];
    for (k, &at) in atn.iter().enumerate() {
        scattered[at..at + seg].copy_from_slice(&dn[k * seg..(k + 1) * seg]);
    }
    if !s.p.read_only {
        s.fill(m, 0, &scattered);
        let c = s.iov_io(true, c_off, &iov, ReqFlags::NONE, 9)?;
        s.ok(c, &format!("writev of {nmax} iovecs"), props)?;
    }
    if s.p.read_only {
        let c = s.rw(false, c_off, m, 0, nmax * seg)?;
        s.ok(c, "read of the readv range", props)?;
        // SAFETY: no request in flight.
        let d = unsafe { s.mem(m) }[..nmax * seg].to_vec();
        for (k, &at) in atn.iter().enumerate() {
            scattered[at..at + seg].copy_from_slice(&d[k * seg..(k + 1) * seg]);
        }
    } else {
        let c = s.rw(false, c_off, m, nmax * seg, nmax * seg)?;
        s.ok(c, "read of the writev range", props)?;
        let w = s.stored(&dn);
        s.same(
            m,
            nmax * seg,
            &w,
            &format!("read after a writev of {nmax} iovecs"),
            props,
        )?;
        for (k, &at) in atn.iter().enumerate() {
            scattered[at..at + seg].copy_from_slice(&w[k * seg..(k + 1) * seg]);
        }
    }
    s.fill(m, 0, &vec![0; nmax * seg]);
    let c = s.iov_io(false, c_off, &iov, ReqFlags::NONE, 10)?;
    s.ok(c, &format!("readv of {nmax} iovecs"), props)?;
    s.same(m, 0, &scattered, &format!("readv of {nmax} iovecs"), props)?;
    Ok(Outcome::Pass(format!(
        "{n3} and {nmax} iovecs of {seg} bytes"
    )))
}

fn unaligned(s: &mut Suite) -> Res {
    let ra = s.p.request_alignment;
    if ra <= 1 {
        return Ok(Outcome::Skip(format!(
            "{}: every offset is aligned",
            s.p.show(&["request-alignment"])
        )));
    }
    let props: &[&str] = &["request-alignment", "direct"];
    let u = s.u;
    let a = s.off(Suite::A);
    let c = s.rw(false, a, Mem::Mapped, 0, 2 * u)?;
    s.ok(c, "aligned read", props)?;
    // SAFETY: no request in flight.
    let reference = unsafe { s.mem(Mem::Mapped) }[..2 * u].to_vec();
    let mut how = Vec::new();
    for (what, off, len) in [("offset", a + 1, u), ("length", a, u - 1)] {
        let at = 2 * u;
        s.fill(Mem::Mapped, at, &vec![0xA5; u]);
        let c = s.rw(false, off, Mem::Mapped, at, len)?;
        if c.ret == -libc::EINVAL {
            how.push(format!("unaligned {what} refused with EINVAL"));
            continue;
        }
        s.ok(c, &format!("read with an unaligned {what}"), props)?;
        let start = (off - a) as usize;
        let mut want = reference[start..start + len].to_vec();
        want.extend(std::iter::repeat_n(0xA5, u - len));
        s.same(
            Mem::Mapped,
            at,
            &want,
            &format!("a read with an unaligned {what} was accepted but moved the wrong bytes"),
            props,
        )?;
        how.push(format!("unaligned {what} accepted and read correctly"));
    }
    Ok(Outcome::Pass(how.join("; ")))
}

fn write_zeroes(s: &mut Suite) -> Res {
    let props: &[&str] = &["max-write-zeroes-len", "request-alignment"];
    let u = s.u;
    let b = s.off(Suite::B);
    let d = pattern(2 * u, 11);
    s.fill(Mem::Mapped, 0, &d);
    let c = s.rw(true, b, Mem::Mapped, 0, 2 * u)?;
    s.ok(c, "write before write-zeroes", props)?;
    let c = s.io(
        Op::WriteZeroes {
            offset: b,
            len: u as u64,
        },
        ReqFlags::NONE,
        1,
    )?;
    if c.ret == -libc::ENOTSUP && s.p.max_write_zeroes_len == 0 {
        return Ok(Outcome::Skip(format!(
            "not supported (ENOTSUP) and {}",
            s.p.show(&["max-write-zeroes-len"])
        )));
    }
    s.ok(c, "write-zeroes", props)?;
    s.fill(Mem::Mapped, 0, &vec![0xAA; 2 * u]);
    let c = s.rw(false, b, Mem::Mapped, 0, 2 * u)?;
    s.ok(c, "read after write-zeroes", props)?;
    let mut want = vec![0; u];
    want.extend(s.stored(&d[u..]));
    s.same(
        Mem::Mapped,
        0,
        &want,
        "read after write-zeroes of the first half",
        props,
    )?;
    let c = s.io(
        Op::WriteZeroes {
            offset: b + u as u64,
            len: u as u64,
        },
        ReqFlags::FUA | ReqFlags::NO_FALLBACK,
        2,
    )?;
    if c.ret == -libc::ENOTSUP && !s.opts.expect.write_zeroes_no_fallback {
        return Ok(Outcome::Pass(
            "write-zeroes with FUA|NO_FALLBACK is not supported (ENOTSUP, allowed)".into(),
        ));
    }
    s.ok(c, "write-zeroes with FUA|NO_FALLBACK", props)?;
    let c = s.rw(false, b, Mem::Mapped, 0, 2 * u)?;
    s.ok(c, "read after write-zeroes", props)?;
    s.same(
        Mem::Mapped,
        0,
        &vec![0; 2 * u],
        "read after write-zeroes with FUA|NO_FALLBACK",
        props,
    )?;
    pass()
}

fn discard(s: &mut Suite) -> Res {
    let props: &[&str] = &["max-discard-len", "discard-alignment"];
    let da = s.p.discard_alignment.max(1);
    // Not at A: later checks read what the read-write check left there.
    let off = align_up(s.off(Suite::A2), da);
    let mut len = align_up(4 * s.u as u64, da);
    if s.p.max_discard_len > 0 {
        len = len.min(s.p.max_discard_len / da * da);
    }
    if len == 0 || off + len > s.off(Suite::C) {
        return Ok(Outcome::Skip(format!(
            "no discard range fits the suite's area [{}]",
            s.p.show(props)
        )));
    }
    let c = s.io(Op::Discard { offset: off, len }, ReqFlags::NONE, 1)?;
    if c.ret == -libc::ENOTSUP && s.p.max_discard_len == 0 {
        return Ok(Outcome::Skip(format!(
            "not supported (ENOTSUP) and {}",
            s.p.show(&["max-discard-len"])
        )));
    }
    s.ok(c, &format!("discard of {len} bytes at {off}"), props)?;
    let l = len as usize;
    s.fill(Mem::Mapped, 0, &vec![0xAA; l]);
    let c = s.rw(false, off, Mem::Mapped, 0, l)?;
    s.ok(c, "read after discard", props)?;
    if s.opts.expect.discard_zeroes || s.model == DataModel::Zeroes {
        s.same(
            Mem::Mapped,
            0,
            &vec![0; l],
            "discarded range does not read as zeros",
            props,
        )?;
        return Ok(Outcome::Pass("the discarded range reads as zeros".into()));
    }
    pass()
}

fn flush(s: &mut Suite) -> Res {
    let c = s.io(Op::Flush, ReqFlags::NONE, 1)?;
    s.ok(c, "flush", &["flush-needed", "read-only"])?;
    pass()
}

fn request_errors(s: &mut Suite) -> Res {
    let c = s.rw_flags(false, 0, Mem::Mapped, 0, s.u, ReqFlags::FUA)?;
    s.want_err(c, libc::EINVAL, "read with FUA", &[])?;
    let msg = c.error_msg().map(|m| m.to_string_lossy().into_owned());
    ensure!(
        msg.as_deref() == Some("BLKIO_REQ_FUA is invalid for this request type"),
        "read with FUA: message {msg:?}"
    );
    let c = s.io(
        Op::Zone(snapblk_core::ZoneOp::Report {
            offset: 0,
            zones: std::ptr::null_mut(),
            nr_zones: 0,
        }),
        ReqFlags::NONE,
        2,
    )?;
    s.want_err(c, libc::ENOTSUP, "zone request", &[])?;
    let c = s.rw(false, u64::MAX - s.u as u64 + 1, Mem::Mapped, 0, s.u)?;
    s.want_err(c, libc::EINVAL, "read at an offset past 2^63", &[])?;
    if !s.p.read_only {
        let c = s.rw(true, 1 << 63, Mem::Mapped, 0, s.u)?;
        s.want_err(c, libc::EINVAL, "write at offset 2^63", &[])?;
    }
    pass()
}

fn bounds(s: &mut Suite) -> Res {
    let props: &[&str] = &["capacity", "can-grow"];
    let u = s.u as u64;
    let cap = s.p.capacity;
    let end = cap / u * u - u;
    let tail = (cap - end) as usize;
    s.fill(Mem::Mapped, 0, &vec![0xAA; 2 * s.u]);
    let c = s.rw(false, end, Mem::Mapped, 0, 2 * s.u)?;
    if s.p.can_grow {
        s.ok(
            c,
            &format!("read of {} bytes at {end}, across the end", 2 * u),
            props,
        )?;
        s.same(
            Mem::Mapped,
            tail,
            &vec![0; 2 * s.u - tail],
            "bytes past the end are not zero-filled",
            props,
        )?;
        return Ok(Outcome::Pass(
            "a read across the end zero-fills past it".into(),
        ));
    }
    s.want_err(
        c,
        libc::EIO,
        &format!("read of {} bytes at {end}, across the end", 2 * u),
        props,
    )?;
    let c = s.rw(false, align_up(cap, u), Mem::Mapped, 0, s.u)?;
    s.want_err(c, libc::EIO, "read past the end", props)?;
    if !s.p.read_only {
        let c = s.rw(true, end, Mem::Mapped, 0, 2 * s.u)?;
        ensure!(
            c.ret < 0,
            "write across the end succeeded [{}]",
            s.p.show(props)
        );
    }
    Ok(Outcome::Pass("I/O across the end fails with EIO".into()))
}

fn can_grow(s: &mut Suite) -> Res {
    let props: &[&str] = &["can-grow", "capacity"];
    if !s.p.can_grow {
        return Ok(Outcome::Skip(format!(
            "{} (see bounds)",
            s.p.show(&["can-grow"])
        )));
    }
    if s.p.read_only {
        return Ok(Outcome::Skip(format!(
            "{}: nothing can grow it",
            s.p.show(&["read-only"])
        )));
    }
    let u = s.u;
    let off = align_up(s.p.capacity, u as u64);
    let d = pattern(u, 21);
    s.fill(Mem::Mapped, 0, &d);
    let c = s.rw(true, off, Mem::Mapped, 0, u)?;
    s.ok(c, &format!("write at {off}, past the end"), props)?;
    let cap = match s.b.get_u64("capacity") {
        Ok(c) => c,
        Err(e) => fail!("capacity after growing: {e}"),
    };
    ensure!(
        cap >= off + u as u64,
        "capacity is {cap} after a write ending at {} [{}]",
        off + u as u64,
        s.p.show(props)
    );
    s.fill(Mem::Mapped, 0, &vec![0; u]);
    let c = s.rw(false, off, Mem::Mapped, 0, u)?;
    s.ok(c, "read of the grown part", props)?;
    let w = s.stored(&d);
    s.same(Mem::Mapped, 0, &w, "read of the grown part", props)?;
    Ok(Outcome::Pass(format!("capacity grew to {cap}")))
}

fn backlog(s: &mut Suite) -> Res {
    let (u, t) = (s.u, s.opts.timeout);
    let n = 200;
    let base = s.base(Mem::Mapped) as usize;
    let span = s.off(Suite::C - Suite::A);
    let q = s.q0()?;
    for i in 0..n {
        let off = (i * u) as u64 % span;
        let req = Request::new(
            Op::Read {
                offset: off,
                buf: (base + (i % 64) * u) as *mut u8,
                len: u,
            },
            1000 + i,
            ReqFlags::NONE,
        );
        // SAFETY: 64 block-sized slices of the mapped region, live until `release`; all
        // requests are reaped below (or by `drain`).
        unsafe { q.enqueue(req) };
    }
    ensure!(
        q.outstanding() == n,
        "outstanding() is {} after {n} enqueues",
        q.outstanding()
    );
    let mut cs = vec![Completion::default(); n];
    ensure!(
        q.do_io(&mut cs, n + 1, None, None).is_err(),
        "do_io with min_completions > max_completions succeeded"
    );
    let mut got = 0;
    while got < n {
        got += wait(q, &mut cs[got..], 1, t)?;
    }
    let mut uds: Vec<usize> = cs.iter().map(|c| c.user_data).collect();
    uds.sort_unstable();
    ensure!(
        uds == (1000..1000 + n).collect::<Vec<_>>(),
        "user_data of {n} completions do not match the requests"
    );
    if let Some(c) = cs.iter().find(|c| c.ret != 0) {
        fail!("a read of the backlog failed: {}", describe(c));
    }
    match q.do_io(&mut cs[..1], 1, None, None) {
        Err(e) => ensure!(
            e.errno == libc::EINVAL
                && e.msg == "min_completions is larger than total outstanding requests",
            "do_io waiting for more than is outstanding: {e} (errno {})",
            e.errno
        ),
        Ok(k) => fail!("do_io waiting for more than is outstanding returned {k}"),
    }
    Ok(Outcome::Pass(format!("{n} requests in flight at once")))
}

fn completion_fd(s: &mut Suite) -> Res {
    let t = s.opts.timeout;
    let buf = s.base(Mem::Mapped);
    let u = s.u;
    let q = s.q0()?;
    let Some(fd) = q.completion_fd() else {
        fail!("queue 0 is not a poll queue but has no completion fd");
    };
    q.set_completion_fd_enabled(true);
    while read_eventfd(fd) {}
    let req = Request::new(
        Op::Read {
            offset: 0,
            buf,
            len: u,
        },
        5,
        ReqFlags::NONE,
    );
    // SAFETY: the mapped region is live until `release`; the request is reaped below.
    if let Err(why) = unsafe { enqueue_and_poll(q, req, fd, t) }? {
        fail!("the completion fd did not become readable within {t:?} ({why})");
    }
    let mut left = Duration::from_secs(5);
    // SAFETY: an empty, initialised signal set.
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to the set.
    unsafe { libc::sigemptyset(&mut mask) };
    let mut c = [Completion::default()];
    match q.do_io(&mut c, 1, Some(&mut left), Some(&mask)) {
        Ok(1) => {}
        Err(e) if e.errno == libc::ETIME => {
            return Err(Stop::Fatal("no completion within 5 s".into()));
        }
        r => fail!("do_io with a timeout and a signal mask returned {r:?}"),
    }
    ensure!(
        c[0].user_data == 5 && c[0].ret == 0,
        "completion {}, user_data {}",
        describe(&c[0]),
        c[0].user_data
    );
    ensure!(
        left < Duration::from_secs(5) && left > Duration::from_secs(3),
        "time left not written back: {left:?}"
    );
    let n = s.regular_queues();
    if n < 2 {
        return pass();
    }
    let extra = fd_routing(s, n)?;
    let mut how = format!("each of {n} queues wakes its own completion fd");
    if !extra.is_empty() {
        // Allowed (the API permits spurious wake-ups), but worth seeing: e.g. queues sharing
        // one interrupt vector.
        how += &format!("; spurious wake-ups of other queues: {}", extra.join(", "));
    }
    Ok(Outcome::Pass(how))
}

/// A request on queue `i` makes queue `i`'s completion fd readable: an event loop waiting on
/// the fd of the queue it submitted to must wake. Returns the other queues a request woke too
/// (`"queue 0 woke [1]"`), spurious wake-ups the API allows.
fn fd_routing(s: &mut Suite, n: usize) -> Result<Vec<String>, Stop> {
    let (u, t) = (s.u, s.opts.timeout);
    let a = s.off(Suite::A);
    let base = s.base(Mem::Mapped) as usize;
    let (mut fds, mut extra) = (Vec::with_capacity(n), Vec::new());
    for i in 0..n {
        let Some(q) = s.b.queue(i, false) else {
            fail!("queue {i} is missing [{}]", s.p.show(&["num-queues"]));
        };
        let Some(fd) = q.completion_fd() else {
            fail!("queue {i} is not a poll queue but has no completion fd");
        };
        q.set_completion_fd_enabled(true);
        while read_eventfd(fd) {}
        fds.push(fd);
    }
    for i in 0..n {
        let Some(q) = s.b.queue(i, false) else {
            fail!("queue {i} is missing");
        };
        let req = Request::new(
            Op::Read {
                offset: a,
                buf: (base + (64 + i) * u) as *mut u8,
                len: u,
            },
            100 + i,
            ReqFlags::NONE,
        );
        // SAFETY: block 64+i of the mapped region lives until `release`; the request is reaped
        // below (or the suite stops with Fatal and never frees the region).
        let woke = unsafe { enqueue_and_poll(&mut **q, req, fds[i], t) }?;
        // Other queues' fds that fired too (or instead): read before the request is reaped.
        let others: Vec<usize> = (0..n).filter(|&j| j != i && read_eventfd(fds[j])).collect();
        let mut c = [Completion::default()];
        wait(&mut **q, &mut c, 1, t)?;
        if let Err(why) = woke {
            fail!(
                "a read on queue {i} did not make its completion fd readable within {t:?} \
                 ({why}; the fds of queues {others:?} were readable)"
            );
        }
        if !others.is_empty() {
            extra.push(format!("queue {i} woke {others:?}"));
        }
        ensure!(
            c[0].user_data == 100 + i && c[0].ret == 0,
            "queue {i}: completion {}, user_data {}",
            describe(&c[0]),
            c[0].user_data
        );
        // A late wake-up of any queue must not count for the next one.
        for &fd in &fds {
            while read_eventfd(fd) {}
        }
    }
    Ok(extra)
}

/// Enqueue `req` on `q`, submit it without waiting (`do_io` with min and max 0), then wait up
/// to `t` for completion fd `fd` to become readable: `Ok(Err(what poll said))` when it did not.
///
/// # Safety
/// As [`snapblk_core::Queue::enqueue`]: the request's buffers stay valid until it is reaped.
unsafe fn enqueue_and_poll(
    q: &mut dyn snapblk_core::Queue,
    req: Request,
    fd: i32,
    t: Duration,
) -> Result<Result<(), String>, Stop> {
    // SAFETY: forwarded from the caller.
    unsafe { q.enqueue(req) };
    match q.do_io(&mut [], 0, None, None) {
        Ok(0) => {}
        r => fail!("do_io(min 0, max 0) returned {r:?}"),
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let r = unsafe { libc::poll(&mut p, 1, t.as_millis().min(i32::MAX as u128) as i32) };
    Ok(if r == 1 && p.revents & libc::POLLIN != 0 {
        Ok(())
    } else {
        Err(format!("poll returned {r}, revents {:#x}", p.revents))
    })
}

fn queues(s: &mut Suite) -> Res {
    let props: &[&str] = &[
        "num-queues",
        "max-queues",
        "can-add-queues",
        "supports-poll-queues",
    ];
    let (u, t) = (s.u, s.opts.timeout);
    let a = s.off(Suite::A);
    let want = s.reference(u)?;
    let base = s.base(Mem::Mapped) as usize;
    let n = s.regular_queues();
    let mut taken = Vec::new();
    for i in 1..n {
        match s.b.take_queue(i, false) {
            Some(q) => taken.push((i, q)),
            None => fail!("queue {i} is missing [{}]", s.p.show(props)),
        }
    }
    let results: Vec<Result<(), Stop>> = std::thread::scope(|sc| {
        let hs: Vec<_> = taken
            .into_iter()
            .map(|(i, mut q)| {
                let want = &want;
                sc.spawn(move || -> Result<(), Stop> {
                    let buf = (base + (64 + i) * u) as *mut u8;
                    let req = Request::new(
                        Op::Read {
                            offset: a,
                            buf,
                            len: u,
                        },
                        i,
                        ReqFlags::NONE,
                    );
                    // SAFETY: block 64+i of the mapped region is this thread's alone and lives
                    // until `release`, after this scope.
                    let c = unsafe { submit(&mut *q, req, t) }?;
                    ensure!(
                        c.ret == 0,
                        "read on queue {i} from another thread: {}",
                        describe(&c)
                    );
                    // SAFETY: the read completed; nobody else touches this block.
                    let got = unsafe { std::slice::from_raw_parts(buf, u) };
                    ensure!(got == &want[..], "read on queue {i}: {}", diff(got, want));
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Stop::Fail("a queue thread panicked".into())))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    let mut how = vec![format!(
        "{n} queue(s), {} from other threads",
        n.saturating_sub(1)
    )];
    for poll in [false, true] {
        if !s.p.can_add_queues || (poll && !s.p.supports_poll_queues) {
            continue;
        }
        let i = match s.b.add_queue(poll) {
            Ok(i) => i,
            Err(e) => fail!("add_queue(poll={poll}): {e} [{}]", s.p.show(props)),
        };
        let buf = (base + 127 * u) as *mut u8;
        let Some(q) = s.b.queue(i, poll) else {
            fail!("added queue {i} (poll={poll}) is missing");
        };
        ensure!(
            q.is_poll() == poll,
            "added queue {i}: is_poll() is {}",
            q.is_poll()
        );
        if poll {
            ensure!(
                q.completion_fd().is_none(),
                "poll queue {i} has a completion fd"
            );
        }
        let req = Request::new(
            Op::Read {
                offset: a,
                buf,
                len: u,
            },
            42,
            ReqFlags::NONE,
        );
        // SAFETY: the last block of the mapped region, unused by others now.
        let c = unsafe { submit(&mut **q, req, t) }?;
        ensure!(
            c.ret == 0,
            "read on added queue {i} (poll={poll}): {}",
            describe(&c)
        );
        // SAFETY: the read completed.
        let got = unsafe { std::slice::from_raw_parts(buf, u) };
        ensure!(
            got == &want[..],
            "read on added queue {i}: {}",
            diff(got, &want)
        );
        if let Err(e) = s.b.remove_queue(i, poll) {
            fail!("remove_queue({i}, poll={poll}): {e}");
        }
        how.push(if poll {
            "a poll queue added and removed".into()
        } else {
            "a queue added and removed".to_string()
        });
    }
    if n == 1 && !s.p.can_add_queues {
        return Ok(Outcome::Skip(format!(
            "one queue only [{}]",
            s.p.show(props)
        )));
    }
    Ok(Outcome::Pass(how.join("; ")))
}

fn release(s: &mut Suite) -> Res {
    let mut bad = Vec::new();
    if let Some(r) = s.mapped.take() {
        s.b.unmap_mem_region(&r);
        if let Err(e) = s.b.free_mem_region(&r) {
            bad.push(format!("free of the mapped region: {e}"));
        }
    }
    if let Some(r) = s.unmapped.take()
        && let Err(e) = s.b.free_mem_region(&r)
    {
        bad.push(format!("free of the unmapped region: {e}"));
    }
    if let Some(r) = s.plain.take() {
        // SAFETY: allocated by `setup` with `alloc_private`, freed once (taken out of the
        // suite), and no request uses it any more (every request was reaped).
        unsafe { r.free() };
    }
    ensure!(bad.is_empty(), "{}", bad.join("; "));
    pass()
}

// ---- the runner --------------------------------------------------------------------------------

type Check = fn(&mut Suite) -> Res;

fn plan(p: &Props) -> Vec<(&'static str, Check)> {
    let mut v: Vec<(&'static str, Check)> = vec![
        ("properties", properties),
        ("expectations", expectations),
        ("mem-regions", setup),
    ];
    if p.read_only {
        v.push(("read/mapped", |s| read_write(s, Mem::Mapped)));
        v.push(("read/plain", |s| read_write(s, Mem::Plain)));
        v.push(("write-refusal", write_refusal));
    } else {
        v.push(("read-write/mapped", |s| read_write(s, Mem::Mapped)));
        v.push(("read-write/plain", |s| read_write(s, Mem::Plain)));
    }
    v.extend([
        ("unmapped-buffers", unmapped_buffers as Check),
        ("vectored/mapped", |s| vectored(s, Mem::Mapped)),
        ("vectored/plain", |s| vectored(s, Mem::Plain)),
        ("unaligned", unaligned),
    ]);
    if !p.read_only {
        v.extend([
            ("write-zeroes", write_zeroes as Check),
            ("discard", discard),
        ]);
    }
    v.extend([
        ("flush", flush as Check),
        ("request-errors", request_errors),
        ("bounds", bounds),
        ("can-grow", can_grow),
        ("backlog", backlog),
        ("completion-fd", completion_fd),
        ("queues", queues),
        ("release", release),
    ]);
    v
}

pub(crate) fn run(mut b: Blkio, opts: &Options) -> Report {
    let mut report = Report {
        target: b.driver_name().to_owned(),
        checks: Vec::new(),
    };
    if b.state() == State::Connected {
        let max = b.get_int("max-queues").unwrap_or(1);
        let n = max.min(opts.queues).max(1);
        if let Err(e) = b.set_int("num-queues", n).and_then(|()| b.start()) {
            report.checks.push((
                "properties",
                Outcome::Fail(format!("start with num-queues={n}: {e}")),
            ));
            return report;
        }
    }
    if b.state() != State::Started {
        report.checks.push((
            "properties",
            Outcome::Fail("the instance is not connected".into()),
        ));
        return report;
    }
    let p = match Props::read(&b) {
        Ok(p) => p,
        Err(m) => {
            report.checks.push(("properties", Outcome::Fail(m)));
            return report;
        }
    };
    report.target = p.show(SHOWN);
    let model = opts.data.unwrap_or(if p.driver == "null" {
        DataModel::Zeroes
    } else {
        DataModel::Stored
    });
    let ra = p.request_alignment.max(p.buf_alignment).max(1) as usize;
    let mut u = ra.max(4096);
    if p.max_transfer > 0 && (p.max_transfer as usize) < u {
        u = ra;
    }
    let checks = plan(&p);
    let too_small = p.capacity < Suite::NEEDED * u as u64;
    let mut s = Suite {
        b,
        opts: opts.clone(),
        model,
        u,
        rlen: 0,
        mapped: None,
        unmapped: None,
        plain: None,
        at_a: Vec::new(),
        p,
    };
    if too_small {
        report.checks.push((
            "properties",
            Outcome::Fail(format!(
                "the suite needs {} blocks of {u} bytes [{}]",
                Suite::NEEDED,
                s.p.show(&["capacity", "request-alignment", "buf-alignment"])
            )),
        ));
        return report;
    }
    let mut hung = None;
    for (name, check) in checks {
        if let Some(h) = &hung {
            report
                .checks
                .push((name, Outcome::Skip(format!("not run: {h}"))));
            continue;
        }
        let r = check(&mut s);
        let r = match r {
            Ok(o) => Ok(o),
            Err(Stop::Fail(m)) => match s.drain() {
                Ok(()) => Ok(Outcome::Fail(m)),
                Err(Stop::Fatal(h) | Stop::Fail(h)) => Err(format!("{m}; then {h}")),
            },
            Err(Stop::Fatal(m)) => Err(m),
        };
        match r {
            Ok(o) => report.checks.push((name, o)),
            Err(m) => {
                report
                    .checks
                    .push((name, Outcome::Fail(format!("{m}: the suite stops here"))));
                hung = Some(format!("{name} stopped the suite"));
            }
        }
    }
    if hung.is_some() {
        // A request may still use the instance's memory: leak it rather than free it under
        // the device.
        std::mem::forget(s);
    }
    report
}
