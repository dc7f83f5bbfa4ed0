// kv_append.cu — write this step's keys and values (already rotated) into the sequences'
// paged KV blocks, as f16, checking every write in the kernel:
//   - the position lies in [committed length, readable) of its sequence,
//   - its block index lies inside the sequence's block table and the pool,
//   - the block's owner tag is the sequence's tenant.
// A violation is recorded in `status` (first one per sequence wins) and nothing is
// written for that row. Writes are never exempted by a fault switch (as on the CPU).
//
// Launch: grid = (rows, 1, 1), block = (256, 1, 1); threads stride over kv_dim.
// Tensors: qkv      f32 [rows, row_stride]     (keys at k_offset, values at k_offset + kv_dim)
//          kv       u16 [total_blocks, 2, layers, block_tokens, kv_dim]   (f16 bits)
//          tags     u32 [total_blocks]
//          tables   u32 [Σ table_len]          (block ids, each sequence's run at SEQ_TABLE_AT)
//          seqs     u32 [n_seqs, SEQ_FIELDS]
//          row_seq  u32 [rows], row_pos u32 [rows]
//          status   u32 [n_seqs, 3]            (code, block, position)
extern "C" __global__ void kv_append(const float* qkv, u32 row_stride, u32 k_offset, u16* kv, const u32* tags,
                                     const u32* tables, const u32* seqs, const u32* row_seq, const u32* row_pos,
                                     u32* status, u32 layer, u32 layers, u32 block_tokens, u32 kv_dim,
                                     u32 total_blocks) {
    __shared__ u32 target;  // block id, or 0xffffffff when the write is refused
    const u32 row = blockIdx.x;
    const u32 s = row_seq[row], pos = row_pos[row];
    const u32* seq = seqs + s * SEQ_FIELDS;
    if (threadIdx.x == 0) {
        const u32 bi = pos / block_tokens;
        u32 id = 0xffffffffu;
        if (pos < seq[SEQ_WRITE_FROM] || pos >= seq[SEQ_READABLE] || bi >= seq[SEQ_TABLE_LEN]) {
            kv_report(status, s, KV_OUT_OF_BOUNDS, 0xffffffffu, pos);
        } else {
            const u32 candidate = tables[seq[SEQ_TABLE_AT] + bi];
            if (candidate >= total_blocks) {
                kv_report(status, s, KV_OUT_OF_BOUNDS, candidate, pos);
            } else if (tags[candidate] != seq[SEQ_TENANT]) {
                kv_report(status, s, KV_FOREIGN_BLOCK, candidate, pos);
            } else {
                id = candidate;
            }
        }
        target = id;
    }
    __syncthreads();
    const u32 id = target;
    if (id == 0xffffffffu) return;
    const u32 slot = pos % block_tokens;
    u16* k = kv + kv_row(id, 0u, layer, slot, layers, block_tokens, kv_dim);
    u16* v = kv + kv_row(id, 1u, layer, slot, layers, block_tokens, kv_dim);
    const float* src = qkv + (u64)row * row_stride + k_offset;
    for (u32 c = threadIdx.x; c < kv_dim; c += blockDim.x) {
        k[c] = f32_to_f16(src[c]);
        v[c] = f32_to_f16(src[kv_dim + c]);
    }
}
