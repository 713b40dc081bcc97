//! The suite on the `toy-mem` driver, which requires memory regions: the correct driver passes
//! it, and each deliberately broken variant fails the check that covers its bug.

use snapblk_conformance::toy::{self, Flaw, ToyDriver};
use snapblk_conformance::{Expect, Options, Outcome, Report};
use snapblk_core::Blkio;

fn toy(flaw: Flaw, read_only: bool) -> Blkio {
    let mut b = Blkio::new(Box::new(ToyDriver::with_flaw(flaw)));
    b.set_bool("read-only", read_only).unwrap();
    b.connect().unwrap();
    b
}

fn run(flaw: Flaw, read_only: bool) -> Report {
    let opts = Options {
        expect: Expect {
            capacity: Some(toy::DEFAULT_SIZE),
            can_grow: Some(false),
            read_only: Some(read_only),
            discard_zeroes: true,
            write_zeroes_no_fallback: true,
            ..Expect::default()
        },
        ..Options::default()
    };
    let r = snapblk_conformance::run(toy(flaw, read_only), &opts);
    println!("{r}");
    r
}

fn pass_text(r: &Report, check: &str) -> String {
    match r.outcome(check) {
        Some(Outcome::Pass(how)) => how.clone(),
        o => panic!("{check}: {o:?}\n{r}"),
    }
}

#[test]
fn the_toy_driver_requires_memory_regions_and_passes() {
    let r = run(Flaw::None, false);
    assert!(r.passed(), "{r}");
    assert!(r.target.contains("needs-mem-regions=true"), "{}", r.target);
    assert!(r.target.contains("max-queues=2,"), "{}", r.target);
    // Plain memory is refused, so only the mapped variants run; the device cannot grow.
    assert_eq!(
        r.skipped(),
        ["read-write/plain", "vectored/plain", "can-grow"],
        "{r}"
    );
    assert!(pass_text(&r, "unmapped-buffers").contains("fail with EFAULT"));
    assert_eq!(
        pass_text(&r, "unaligned"),
        "unaligned offset refused with EINVAL; unaligned length refused with EINVAL"
    );
    assert_eq!(
        pass_text(&r, "vectored/mapped"),
        "3 and 8 iovecs of 4096 bytes"
    );
    assert_eq!(pass_text(&r, "queues"), "2 queue(s), 1 from other threads");
    assert_eq!(
        pass_text(&r, "completion-fd"),
        "each of 2 queues wakes its own completion fd"
    );
    assert_eq!(
        pass_text(&r, "discard"),
        "the discarded range reads as zeros"
    );
}

#[test]
fn a_read_only_toy_gets_write_refusal_checks() {
    let r = run(Flaw::None, true);
    assert!(r.passed(), "{r}");
    assert!(r.outcome("write-refusal").is_some() && r.outcome("read-write/mapped").is_none());
    assert!(r.outcome("write-zeroes").is_none() && r.outcome("discard").is_none());
}

#[test]
fn a_driver_that_ignores_the_offset_fails() {
    let r = run(Flaw::IgnoresOffset, false);
    assert!(!r.passed());
    assert!(r.failed().contains(&"read-write/mapped"), "{r}");
}

#[test]
fn a_driver_that_accepts_unmapped_buffers_fails() {
    let r = run(Flaw::AcceptsUnmappedBuffers, false);
    assert_eq!(r.failed(), ["unmapped-buffers"], "{r}");
    match r.outcome("unmapped-buffers") {
        Some(Outcome::Fail(m)) => assert!(
            m.contains("expected -14") && m.contains("needs-mem-regions=true"),
            "{m}"
        ),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_driver_whose_queues_share_one_completion_fd_fails() {
    // The suite waits its whole timeout for the fd that never fires: keep it short.
    let opts = Options {
        timeout: std::time::Duration::from_millis(300),
        ..Options::default()
    };
    let r = snapblk_conformance::run(toy(Flaw::SharesFirstCompletionFd, false), &opts);
    assert_eq!(r.failed(), ["completion-fd"], "{r}");
    match r.outcome("completion-fd") {
        Some(Outcome::Fail(m)) => assert!(
            // Queue 1 reports queue 0's fd, which its own reads never fire.
            m.contains("a read on queue 1 did not make its completion fd readable"),
            "{m}"
        ),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_driver_that_rounds_unaligned_offsets_fails() {
    let r = run(Flaw::RoundsUnalignedOffsets, false);
    assert_eq!(r.failed(), ["unaligned"], "{r}");
    match r.outcome("unaligned") {
        Some(Outcome::Fail(m)) => assert!(m.contains("request-alignment=512"), "{m}"),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_request_that_never_completes_stops_the_suite_instead_of_hanging_it() {
    let opts = Options {
        timeout: std::time::Duration::from_millis(300),
        ..Options::default()
    };
    let t = std::time::Instant::now();
    let r = snapblk_conformance::run(toy(Flaw::HangsOnUnmappedBuffers, false), &opts);
    println!("{r}");
    assert!(t.elapsed() < std::time::Duration::from_secs(10), "{r}");
    assert_eq!(r.failed(), ["unmapped-buffers"], "{r}");
    match r.outcome("unmapped-buffers") {
        Some(Outcome::Fail(m)) => assert!(m.contains("the suite stops here"), "{m}"),
        o => panic!("{o:?}"),
    }
    // Everything after it is reported as not run, not as passed.
    let i = r
        .checks
        .iter()
        .position(|(n, _)| *n == "unmapped-buffers")
        .unwrap();
    assert!(r.checks.len() > i + 5);
    for (n, o) in &r.checks[i + 1..] {
        assert!(
            matches!(o, Outcome::Skip(m) if m.starts_with("not run")),
            "{n}: {o:?}"
        );
    }
}

#[test]
fn the_toy_refuses_regions_without_fd_and_too_many_queues() {
    let mut b = toy(Flaw::None, false);
    b.set_int("num-queues", 3).unwrap();
    assert_eq!(b.start().unwrap_err().errno, libc::EINVAL);
    b.set_int("num-queues", 2).unwrap();
    b.start().unwrap();
    let plain = snapblk_core::MemRegion::alloc_private(4096).unwrap();
    let e = b.map_mem_region(&plain).unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (libc::EIO, "Bad file descriptor (os error 9)")
    );
    // SAFETY: allocated above, never used by a request.
    unsafe { plain.free() };
}
