//! `merge_operations`: the COW_COPY and COW_XOR operations of a partition, in an order in
//! which merging them one after the other on the old partition never reads a block an
//! earlier one overwrote; operations in dependency cycles are dropped (their blocks go to the
//! COW as raw data and merge after every ordered operation).

use std::collections::BTreeSet;

use crate::proto::{CowMergeOpType, CowMergeOperation, Extent};

/// A merge operation: `dst` blocks (start, count) from the old blocks `src` (start, count;
/// one more than `dst` for an XOR with a non-zero `offset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MergeOp {
    pub(crate) xor: bool,
    pub(crate) src: (u64, u64),
    pub(crate) dst: (u64, u64),
    pub(crate) offset: u32,
}

impl MergeOp {
    /// A COW_COPY whose source is its destination: nothing to merge.
    fn identity(&self) -> bool {
        !self.xor && self.src == self.dst
    }

    pub(crate) fn to_proto(self) -> CowMergeOperation {
        let ext = |(s, n): (u64, u64)| Extent {
            start_block: Some(s),
            num_blocks: Some(n),
        };
        CowMergeOperation {
            r#type: Some(if self.xor {
                CowMergeOpType::CowXor as i32
            } else {
                CowMergeOpType::CowCopy as i32
            }),
            src_extent: Some(ext(self.src)),
            dst_extent: Some(ext(self.dst)),
            src_offset: (self.offset != 0).then_some(self.offset),
        }
    }
}

/// COW_COPY operations for a SOURCE_COPY of `n` blocks from `src` to `dst`, split into
/// pieces that do not overlap themselves (steps of |src − dst| blocks) when the two ranges
/// overlap.
pub(crate) fn copies(src: u64, dst: u64, n: u64, out: &mut Vec<MergeOp>) {
    let step = if src == dst {
        n
    } else {
        src.abs_diff(dst).min(n)
    };
    let mut i = 0;
    while i < n {
        let k = step.min(n - i);
        out.push(MergeOp {
            xor: false,
            src: (src + i, k),
            dst: (dst + i, k),
            offset: 0,
        });
        i += k;
    }
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// What [`order`] made: the ordered operations and how many were dropped to break cycles.
#[derive(Debug, Default)]
pub(crate) struct Ordered {
    pub(crate) ops: Vec<MergeOp>,
    pub(crate) dropped: Vec<MergeOp>,
}

/// Order `ops` (destinations disjoint): an operation that reads a block merges before the one
/// that writes it (Kahn's algorithm, ready operations by ascending destination); when only
/// cycles are left, the operation with the most dependants (an XOR on a tie) is dropped.
pub(crate) fn order(mut ops: Vec<MergeOp>) -> Ordered {
    ops.sort_by_key(|o| o.dst.0);
    let n = ops.len();
    // after[a] = operations that must merge after a (those writing what a reads).
    let mut after: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut before = vec![0usize; n];
    for (a, op) in ops.iter().enumerate() {
        if op.identity() {
            continue;
        }
        // Operations whose dst overlaps op.src: dsts are sorted and disjoint.
        let first = ops.partition_point(|o| o.dst.0 + o.dst.1 <= op.src.0);
        for (b, w) in ops.iter().enumerate().skip(first) {
            if w.dst.0 >= op.src.0 + op.src.1 {
                break;
            }
            if b != a && !w.identity() && overlaps(w.dst, op.src) {
                after[a].push(b);
                before[b] += 1;
            }
        }
    }
    let mut ready: BTreeSet<(u64, usize)> = (0..n)
        .filter(|&i| before[i] == 0)
        .map(|i| (ops[i].dst.0, i))
        .collect();
    let mut done = vec![false; n];
    let mut out = Ordered::default();
    let mut left = n;
    while left > 0 {
        let next = ready.pop_first();
        let (i, keep) = match next {
            Some((_, i)) => (i, true),
            None => {
                // Only cycles left: drop the operation with the most pending dependants.
                let pick = (0..n)
                    .filter(|&i| !done[i])
                    .max_by_key(|&i| {
                        let deps = after[i].iter().filter(|&&b| !done[b]).count();
                        (deps, ops[i].xor, std::cmp::Reverse(ops[i].dst.0))
                    })
                    .unwrap_or(0);
                (pick, false)
            }
        };
        if done[i] {
            continue;
        }
        done[i] = true;
        left -= 1;
        if keep {
            out.ops.push(ops[i]);
        } else {
            out.dropped.push(ops[i]);
        }
        for &b in &after[i] {
            before[b] = before[b].saturating_sub(1);
            if before[b] == 0 && !done[b] {
                ready.insert((ops[b].dst.0, b));
            }
        }
    }
    out
}
