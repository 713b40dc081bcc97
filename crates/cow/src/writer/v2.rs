//! The v2 layout: op records and payloads interleaved, or (clustered) `cluster_ops` records
//! followed by their payloads, as AOSP's v2 writer lays them out.

use super::{CowSink, CowWriter, State, inval};
use crate::error::{Result, io_at};
use crate::format::*;

impl<W: CowSink> CowWriter<W> {
    pub(super) fn v2_emit(
        &mut self,
        rec_type: u8,
        compression: u8,
        new_block: u64,
        source: u64,
        payload: &[u8],
    ) -> Result<()> {
        let k = self.header.cluster_ops as usize;
        let len = u16::try_from(payload.len())
            .map_err(|_| inval("v2 payload larger than 65535 bytes"))?;
        let State::V2 {
            stream,
            cluster_start,
            cluster_ops,
            cluster_data,
            num_ops,
        } = &mut self.state
        else {
            return Err(inval("not a v2 writer"));
        };
        let has_source_offset = matches!(rec_type, op_type::REPLACE | op_type::SEQUENCE);
        if k == 0 {
            let pos = stream.pos();
            let src = if has_source_offset { pos + 20 } else { source };
            let rec = encode_op_v2(rec_type, compression, len, new_block, src);
            stream.push(&self.sink, &rec)?;
            stream.push(&self.sink, payload)?;
            *num_ops += 1;
            return Ok(());
        }
        let data_at = *cluster_start + 20 * k as u64 + cluster_data.len() as u64;
        let src = if has_source_offset { data_at } else { source };
        cluster_ops.push(encode_op_v2(rec_type, compression, len, new_block, src));
        cluster_data.extend_from_slice(payload);
        *num_ops += 1;
        if cluster_ops.len() == k - 1 {
            // Close the cluster with a CLUSTER op that skips this cluster's payload.
            let skip = cluster_data.len() as u64;
            cluster_ops.push(encode_op_v2(op_type::CLUSTER, 0, 0, 0, skip));
            *num_ops += 1;
            Self::v2_flush_cluster(&self.sink, cluster_start, cluster_ops, cluster_data, k)?;
        }
        Ok(())
    }

    pub(super) fn v2_flush_cluster(
        sink: &W,
        cluster_start: &mut u64,
        ops: &mut Vec<[u8; 20]>,
        data: &mut Vec<u8>,
        k: usize,
    ) -> Result<()> {
        // Records (padded to the cluster's k slots), then the payloads right after them: two
        // writes, so the payload bytes are not copied once more into a joint buffer.
        let mut recs = Vec::with_capacity(20 * k);
        for r in ops.iter() {
            recs.extend_from_slice(r);
        }
        recs.resize(20 * k, 0);
        sink.write_all_at(*cluster_start, &recs)
            .map_err(io_at(*cluster_start))?;
        let data_at = *cluster_start + recs.len() as u64;
        if !data.is_empty() {
            sink.write_all_at(data_at, data).map_err(io_at(data_at))?;
        }
        *cluster_start = data_at + data.len() as u64;
        ops.clear();
        data.clear();
        Ok(())
    }
}
