//! The on-disk state AOSP's snapuserd leaves when it is killed in the middle of merging an
//! ordered (COPY/XOR) window, built from the specification alone
//! (android-cow-format.md §3 and §10, snapuserd-architecture.md §6.2) — deliberately independent
//! of snapblk's merge engine: it uses the COW header fields, the merge order (as AOSP's
//! GetMergeOpIter yields it) and the target image, nothing else.
//!
//! What snapuserd does per window of up to 510 ordered ops (2 MiB scratch):
//! 1. read-ahead: compute each op's result (= the target content of its new block), copy entries
//!    `{u64 new_block, u64 file_offset}` to `H + 1` (zero entry terminates) and the data to
//!    `H + buffer_size * 16 / 4096`, sync, then state byte (at `H` = header_size) := 2, sync;
//! 2. merge: write the window's destinations from scratch into the base, fsync the base;
//! 3. commit: `num_merge_ops` (offset 26) += window, state byte := 1, msync the first page.
//!
//! Step 3's two stores sit in one mapped page that the kernel may write back at any moment, so a
//! kill can leave the new counter with the old state byte (2) on disk.

/// Where snapuserd was killed during window `N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// (a) window staged (scratch data and entries synced, state byte 2), no destination written.
    AfterStaging,
    /// (b) as (a), and the destinations partly written: the first half of the window's blocks
    /// in write order, then one block torn after 3 sectors.
    MidWrite,
    /// (c) destinations written and flushed, `num_merge_ops` advanced past the window, state
    /// byte still 2 (the counter's page reached the disk before the state byte store).
    AfterCounter,
}

/// A golden case (or a generated one) to crash.
pub struct Input<'a> {
    pub cow: &'a [u8],
    pub base: &'a [u8],
    pub target: &'a [u8],
    /// New block of every merge-order entry.
    pub merge_order: &'a [u64],
    /// Length of the ordered (COPY/XOR) prefix of the merge order.
    pub ordered: usize,
}

/// A crashed state.
pub struct Crashed {
    pub cow: Vec<u8>,
    pub base: Vec<u8>,
    pub num_merge_ops: u64,
    /// Scratch state byte, when the file has scratch.
    pub state: Option<u8>,
    /// The window (merge-order positions) that was in flight.
    pub window: (usize, usize),
}

fn u16_at(b: &[u8], o: usize) -> u64 {
    u16::from_le_bytes([b[o], b[o + 1]]) as u64
}
fn u32_at(b: &[u8], o: usize) -> u64 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]) as u64
}

/// Header fields: (header_size, block_size, buffer_size).
fn header(cow: &[u8]) -> (usize, usize, usize) {
    (
        u16_at(cow, 12) as usize,
        u32_at(cow, 18) as usize,
        u32_at(cow, 34) as usize,
    )
}

/// snapuserd's windows over the ordered prefix: 510 ops with a 2 MiB scratch area (the data
/// capacity, `(buffer_size - buffer_size * 16 / 4096) / block_size`); without scratch the window
/// lives in memory and has the same size.
pub fn windows(inp: &Input) -> Vec<(usize, usize)> {
    let (_, bs, buf) = header(inp.cow);
    let cap = if buf == 0 {
        510
    } else {
        (buf - buf * 16 / 4096) / bs
    };
    (0..inp.ordered)
        .step_by(cap)
        .map(|s| (s, (s + cap).min(inp.ordered)))
        .collect()
}

/// The state after a kill at `kill` during window `w` (index into [`windows`]). `None` for
/// [`Kill::MidWrite`] without scratch: the window then lives in memory only and AOSP cannot
/// recover from that state either (format §10.3).
pub fn crash(inp: &Input, w: usize, kill: Kill) -> Option<Crashed> {
    let (h, bs, buf) = header(inp.cow);
    let (s, e) = windows(inp)[w];
    let block = |img: &[u8], b: u64| img[b as usize * bs..(b as usize + 1) * bs].to_vec();
    let mut base = inp.base.to_vec();
    let put = |img: &mut Vec<u8>, b: u64, data: &[u8]| {
        img[b as usize * bs..b as usize * bs + data.len()].copy_from_slice(data)
    };
    // Windows before w are merged: their destinations hold their results.
    for &nb in &inp.merge_order[..s] {
        put(&mut base, nb, &block(inp.target, nb));
    }
    let window = &inp.merge_order[s..e];
    match kill {
        Kill::AfterStaging => {}
        Kill::MidWrite => {
            if buf == 0 {
                return None;
            }
            let half = window.len().div_ceil(2);
            for &nb in &window[..half] {
                put(&mut base, nb, &block(inp.target, nb));
            }
            if let Some(&nb) = window.get(half) {
                put(&mut base, nb, &block(inp.target, nb)[..3 * 512]);
            }
        }
        Kill::AfterCounter => {
            for &nb in window {
                put(&mut base, nb, &block(inp.target, nb));
            }
        }
    }
    let mut cow = inp.cow.to_vec();
    let n = if kill == Kill::AfterCounter { e } else { s } as u64;
    cow[26..34].copy_from_slice(&n.to_le_bytes());
    let state = (buf != 0).then(|| {
        let meta = buf * 16 / 4096;
        let data = h + meta;
        // Stage a window: entries + terminator, data = each op's result. The previous window is
        // staged first, as it was left in scratch (longer lists leave stale entries behind the
        // terminator, as on a device).
        let mut stage = |ws: &[u64]| {
            for (i, &nb) in ws.iter().enumerate() {
                let at = h + 1 + 16 * i;
                cow[at..at + 8].copy_from_slice(&nb.to_le_bytes());
                cow[at + 8..at + 16].copy_from_slice(&((data + i * bs) as u64).to_le_bytes());
                cow[data + i * bs..data + (i + 1) * bs].copy_from_slice(&block(inp.target, nb));
            }
            let t = h + 1 + 16 * ws.len();
            cow[t..t + 16].fill(0);
        };
        if w > 0 {
            let (ps, pe) = windows(inp)[w - 1];
            stage(&inp.merge_order[ps..pe]);
        }
        stage(window);
        cow[h] = 2;
        2
    });
    Some(Crashed {
        cow,
        base,
        num_merge_ops: n,
        state,
        window: (s, e),
    })
}

/// Merge order and its ordered prefix, from the README (AOSP's inspect_cow output).
pub fn golden_order(readme: &str) -> (Vec<u64>, usize) {
    let order = snapblk_testsupport::golden::readme_merge_order(readme);
    let ops = snapblk_testsupport::golden::readme_ops(readme);
    let kind = |nb: u64| {
        ops.iter()
            .find(|o| o.new_block == nb && o.kind != "kCowLabelOp" && o.kind != "kCowSequenceOp")
            .map(|o| o.kind.clone())
            .unwrap_or_default()
    };
    let ordered = order
        .iter()
        .take_while(|&&nb| matches!(kind(nb).as_str(), "kCowCopyOp" | "kCowXorOp"))
        .count();
    (order, ordered)
}

/// Every kill point, in the order the tests visit them.
pub const KILLS: [Kill; 3] = [Kill::AfterStaging, Kill::MidWrite, Kill::AfterCounter];

/// Every crashed state of `inp`: each window, each kill, the states AOSP can leave (see
/// [`crash`]) in that order, with the kill that left them.
pub fn crashes<'a>(inp: &'a Input) -> impl Iterator<Item = (Kill, Crashed)> + 'a {
    (0..windows(inp).len()).flat_map(move |w| {
        KILLS
            .into_iter()
            .filter_map(move |k| Some((k, crash(inp, w, k)?)))
    })
}

/// The golden cases with ordered (COPY/XOR) ops the resume tests crash: `f(name, input)` for
/// each, with the merge order the README states.
pub fn for_each_golden_input(mut f: impl FnMut(&str, &Input)) {
    for name in [
        "v3_copy_chain_seq",
        "v2_xor_seq_lz4",
        "v2_copy_chain_stream_order",
    ] {
        let d = snapblk_testsupport::golden::case(name).load();
        let (order, ordered) = golden_order(&d.readme);
        assert!(ordered > 0, "{name}: has ordered ops");
        let inp = Input {
            cow: &d.cow,
            base: &d.base,
            target: &d.target,
            merge_order: &order,
            ordered,
        };
        f(name, &inp);
    }
}

/// Whether resuming `c` must redo its window from scratch: only a window whose commit did not
/// reach the disk (state byte 2 and the counter not advanced) is.
pub fn redone_from_scratch(c: &Crashed, kill: Kill) -> bool {
    c.state == Some(2) && kill != Kill::AfterCounter
}

/// The files a finished resume of a crashed state must leave, as AOSP leaves a finished merge:
/// the base is the target image, num_merge_ops is the merge order length and the scratch state
/// byte (when the file has scratch) is 1.
pub fn assert_merged(
    inp: &Input,
    c: &Crashed,
    base: &std::path::Path,
    cow: &std::path::Path,
    what: &str,
) {
    assert!(
        std::fs::read(base).unwrap() == inp.target,
        "{what}: base != target.img"
    );
    let after = std::fs::read(cow).unwrap();
    assert_eq!(
        &after[26..34],
        &(inp.merge_order.len() as u64).to_le_bytes(),
        "{what}: num_merge_ops"
    );
    if c.state.is_some() {
        let (h, _, _) = header(&after);
        assert_eq!(after[h], 1, "{what}: state byte after the merge");
    }
}
