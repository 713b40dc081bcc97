//! Block-level readahead lists: the format lives in `snapblk-blocklist` (re-exported here, so the
//! snapshot driver can read lists without this crate); this module adds [`FdPrefetch`], which
//! replays a list into the page cache of a block device node with readahead(2).

pub use snapblk_blocklist::{
    BLOCK_HEADER, BlockFile, BlockList, BlockPrefetch, BlockRecorder, MAX_META, META_PREFIX,
    replay_blocks,
};

/// Prefetch into the page cache of a block device node with readahead(2).
pub struct FdPrefetch<'a>(pub &'a std::fs::File);

impl BlockPrefetch for FdPrefetch<'_> {
    type Error = std::io::Error;
    fn prefetch(&mut self, offset: u64, len: u64) -> std::io::Result<()> {
        crate::sys::readahead(std::os::fd::AsFd::as_fd(self.0), offset, len)
    }
}
