//! v3 append (writable overlay) and the in-place merge-progress update.

use snapblk_cow::{
    Codec, Compression, CowReader, CowWriter, DuplicatePolicy, MemFile, OpenOptions, ReadAt,
    WriterOptions, read_num_merge_ops, write_num_merge_ops,
};

fn block(v: u8) -> Vec<u8> {
    vec![v; 4096]
}

fn base() -> Vec<u8> {
    (0..8u8).flat_map(block).collect()
}

#[test]
fn append_commits_atomically_and_last_op_wins() {
    let sink = MemFile::default();
    let opts = WriterOptions {
        codec: Codec::new(Compression::Lz4),
        op_count_max: 16,
        ..Default::default()
    };
    let mut w = CowWriter::new(&sink, opts).unwrap();
    w.add_copy(1, 5, 1).unwrap();
    w.add_raw_blocks(2, &block(0xaa)).unwrap();
    w.finalize().unwrap();
    let base = base();
    let last = OpenOptions {
        duplicates: DuplicatePolicy::LastWins,
        ..Default::default()
    };

    // Append two REPLACE ops (one rewrites block 2) and commit.
    let bytes = sink.into_inner();
    let file = MemFile::new(bytes.clone());
    {
        let r = CowReader::open(bytes.as_slice()).unwrap();
        let mut a = CowWriter::append_v3(&file, &r, Codec::new(Compression::Lz4)).unwrap();
        a.add_raw_blocks(2, &block(0xbb)).unwrap();
        a.add_raw_blocks(6, &block(0xcc)).unwrap();
        // Before commit the header still says 2 ops: a crash here loses only the append.
        let mid = file.0.lock().unwrap().clone();
        let r_mid = CowReader::open_with(mid.as_slice(), last).unwrap();
        assert_eq!(r_mid.data_ops().count(), 2);
        a.commit().unwrap();
    }
    let after = file.into_inner();
    // Strict open rejects the rewrite; LastWins serves the newest data.
    assert!(CowReader::open(after.as_slice()).is_err());
    let r = CowReader::open_with(after.as_slice(), last).unwrap();
    assert_eq!(r.data_ops().count(), 4);
    let mut b = vec![0u8; 4096];
    r.read_block(2, base.as_slice(), &mut b).unwrap();
    assert_eq!(b, block(0xbb));
    r.read_block(6, base.as_slice(), &mut b).unwrap();
    assert_eq!(b, block(0xcc));
    r.read_block(1, base.as_slice(), &mut b).unwrap();
    assert_eq!(b, block(5));
    // v2 files cannot be appended to.
    let sink2 = MemFile::default();
    let mut w2 = CowWriter::new(
        &sink2,
        WriterOptions {
            version: 2,
            ..Default::default()
        },
    )
    .unwrap();
    w2.add_zero_blocks(0, 1).unwrap();
    w2.finalize().unwrap();
    let v2 = sink2.into_inner();
    let r2 = CowReader::open(v2.as_slice()).unwrap();
    assert!(
        CowWriter::append_v3(
            &MemFile::new(v2.clone()),
            &r2,
            Codec::new(Compression::None)
        )
        .is_err()
    );
}

#[test]
fn num_merge_ops_update_in_place() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/aosp-cow/v2_xor_seq_lz4/snapshot.cow");
    let f = MemFile::new(std::fs::read(path).unwrap());
    assert_eq!(read_num_merge_ops(&f).unwrap(), 0);
    write_num_merge_ops(&f, 5).unwrap();
    assert_eq!(read_num_merge_ops(&f).unwrap(), 5);
    let bytes = f.into_inner();
    let r = CowReader::open(bytes.as_slice()).unwrap();
    assert_eq!(r.header().num_merge_ops, 5);
    assert_eq!(
        r.merge_order()
            .skip(5)
            .map(|o| o.new_block)
            .collect::<Vec<_>>(),
        vec![2, 30, 31]
    );
    let s = r.header().scratch().unwrap();
    assert_eq!(
        (
            s.state_offset(),
            s.metadata_offset(),
            s.data_offset(),
            s.window_blocks()
        ),
        (38, 39, 8230, 510)
    );
    assert_eq!(bytes.as_slice().size().unwrap(), 2118958);
}

/// A v3 file with only COPY and ZERO ops has no payload: its data end is the start of the
/// payload area, after every op slot (used or not), never inside the unused slots where
/// later ops go.
#[test]
fn v3_data_end_without_payloads_is_after_the_op_slots() {
    for (scratch, seq) in [(0u32, false), (2 << 20, true)] {
        let f = MemFile::default();
        let mut w = CowWriter::new(
            &f,
            WriterOptions {
                version: 3,
                codec: Codec::new(Compression::None),
                scratch_size: scratch,
                op_count_max: 100,
                ..Default::default()
            },
        )
        .unwrap();
        if seq {
            w.add_sequence_data(&[0, 1]).unwrap();
        }
        w.add_copy(0, 5, 2).unwrap();
        w.add_zero_blocks(2, 3).unwrap();
        w.add_label(1).unwrap();
        w.finalize().unwrap();
        let r = CowReader::open(MemFile::new(f.into_inner())).unwrap();
        let h = r.header();
        assert_eq!(r.ops().len(), 5);
        assert_eq!(h.v3_data_offset(), h.v3_op_offset() + 100 * 16);
        assert_eq!(r.data_end(), h.v3_data_offset(), "scratch {scratch}");
    }
}
