//! Computing the FEC in batches of consecutive rounds. Round i's codewords take their j-th
//! symbols from data block j·rounds + i, so for a batch of rounds i0..i1 the j-th symbols of all
//! its codewords are the consecutive blocks j·rounds + i0 .. j·rounds + i1: one read per j, fed
//! to the batch's parity registers byte by byte (each byte position its own codeword). The
//! registers are laid out as the FEC is stored (codeword by codeword, `roots` bytes each), so
//! the batch's finished registers are written as they are.

use snapblk_core::{ReadAt, WriteAt};

use super::rs::Rs;
use super::{FEC_BLOCK_SIZE, FecPlan, RS_SYMBOLS, read_exact, run_parallel, write_all};
use crate::error::VerityError;

/// Rounds a worker computes at a time: 64 blocks (256 KiB) of data read per symbol position,
/// 256 KiB × roots of parity registers.
const BATCH_ROUNDS: u64 = 64;

/// Buffers of one worker.
struct Bufs {
    data: Vec<u8>,
    parity: Vec<u8>,
}

/// Compute and write the FEC `f` over the image's data. `progress` gets the bytes of each
/// symbol position of a batch once fed (zeros past the data included).
pub(super) fn write<I: ReadAt + WriteAt + Sync + ?Sized>(
    f: &FecPlan,
    image: &I,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), VerityError> {
    let bs = u64::from(FEC_BLOCK_SIZE);
    let roots = f.roots as usize;
    let rs = Rs::new(roots);
    let n = RS_SYMBOLS - u64::from(f.roots);
    let data_blocks = f.data.blocks;
    let rounds = f.rounds;
    run_parallel(
        rounds.div_ceil(BATCH_ROUNDS),
        threads,
        || Bufs {
            data: vec![0; (BATCH_ROUNDS * bs) as usize],
            parity: vec![0; (BATCH_ROUNDS * bs) as usize * roots],
        },
        |b, job| {
            let i0 = job * BATCH_ROUNDS;
            let count = (rounds - i0).min(BATCH_ROUNDS);
            let bytes = (count * bs) as usize;
            let data = &mut b.data[..bytes];
            let parity = &mut b.parity[..bytes * rs.roots()];
            parity.fill(0);
            for j in 0..n {
                // Blocks first..first+count of the data; those past its end read as zeros.
                let first = j * rounds + i0;
                let present = data_blocks.saturating_sub(first).min(count);
                let have = (present * bs) as usize;
                if have > 0 {
                    let at = f.data.offset + first * bs;
                    read_exact(image, at, &mut data[..have], "reading the FEC's data")?;
                }
                data[have..].fill(0);
                rs.feed(data, parity);
                progress(bytes as u64);
            }
            let at = f.fec.offset + i0 * bs * u64::from(f.roots);
            write_all(image, at, parity, "writing the FEC")
        },
    )
}
