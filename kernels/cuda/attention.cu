// attention.cu — causal grouped-query attention over the paged, owner-tagged KV cache, for
// prefill and decode alike: every query row carries its sequence and absolute position,
// and attends to positions 0..=pos of its sequence (a decode step is one row per sequence,
// a prefill chunk many rows of one). Arithmetic as forward.rs: q rounded to f16, scores
// q·k * scale, softmax, probabilities rounded to f16, Σ p v.
//
// Isolation is checked in the kernel before any K/V byte is read. Every block the row
// would read must (1) have an entry in the sequence's table and lie inside the pool —
// always, no fault switch lifts this —, (2) carry the sequence's tenant tag (unless
// check_owner == 0: the skip_owner_check fault), and the row must not read past what the
// sequence wrote (unless check_bounds == 0: the skip_bounds_check fault). On a violation
// the kernel records it in `status`, writes zeros for the row and head, and reads nothing.
//
// Launch: grid = (n_head, rows, 1), block = (256, 1, 1); head_dim <= 256.
// Tensors: qkv      f32 [rows, row_stride]            (queries [n_head, head_dim] at 0)
//          out      f32 [rows, n_head * head_dim]
//          scores   f32 [rows, n_head, max_visible]   (workspace; max_visible >= pos + 1)
//          kv       u16 [total_blocks, 2, layers, block_tokens, kv_dim]   (f16 bits)
//          tags     u32 [total_blocks]
//          tables, seqs, row_seq, row_pos, status: as in kv_append.cu
extern "C" __global__ void paged_attention(const float* qkv, u32 row_stride, float* out, float* scores,
                                           u32 max_visible, const u16* kv, const u32* tags, const u32* tables,
                                           const u32* seqs, const u32* row_seq, const u32* row_pos, u32* status,
                                           u32 layer, u32 layers, u32 block_tokens, u32 kv_dim, u32 total_blocks,
                                           u32 n_head, u32 n_head_kv, u32 head_dim, float scale, u32 check_owner,
                                           u32 check_bounds) {
    __shared__ u32 refused;
    __shared__ float q[256];
    __shared__ float partial[256];
    __shared__ float scratch[32];
    const u32 head = blockIdx.x, row = blockIdx.y, tid = threadIdx.x;
    const u32 s = row_seq[row], pos = row_pos[row];
    const u32* seq = seqs + s * SEQ_FIELDS;
    const u32* table = tables + seq[SEQ_TABLE_AT];
    const u32 table_len = seq[SEQ_TABLE_LEN];
    const u32 visible = pos + 1u;
    const u32 n_blocks = (visible + block_tokens - 1u) / block_tokens;
    float* o = out + (u64)row * n_head * head_dim + (u64)head * head_dim;

    // 1. Check every block this row reads; nothing is read before all pass.
    if (tid == 0) refused = 0u;
    __syncthreads();
    // Past what the sequence wrote (or past the host's score workspace, which would be a
    // host sizing bug): refuse rather than read.
    if (tid == 0 && ((visible > seq[SEQ_READABLE] && check_bounds) || visible > max_visible)) {
        kv_report(status, s, KV_OUT_OF_BOUNDS, 0xffffffffu, pos);
        refused = 1u;
    }
    for (u32 i = tid; i < n_blocks; i += blockDim.x) {
        if (i >= table_len || table[i] >= total_blocks) {
            kv_report(status, s, KV_OUT_OF_BOUNDS, i < table_len ? table[i] : 0xffffffffu, i * block_tokens);
            atomicExch(&refused, 1u);
        } else if (check_owner && tags[table[i]] != seq[SEQ_TENANT]) {
            kv_report(status, s, KV_FOREIGN_BLOCK, table[i], i * block_tokens);
            atomicExch(&refused, 1u);
        }
    }
    __syncthreads();
    if (refused) {
        for (u32 d = tid; d < head_dim; d += blockDim.x) o[d] = 0.0f;
        return;
    }

    // 2. Scores: one warp per key position.
    const u32 kvh = head / (n_head / n_head_kv);
    for (u32 d = tid; d < head_dim; d += blockDim.x) q[d] = round_f16(qkv[(u64)row * row_stride + head * head_dim + d]);
    __syncthreads();
    float* sc = scores + ((u64)row * n_head + head) * max_visible;
    const u32 warp = tid / 32u, lane = tid & 31u, warps = blockDim.x / 32u;
    for (u32 p = warp; p < visible; p += warps) {
        const u16* k = kv + kv_row(table[p / block_tokens], 0u, layer, p % block_tokens, layers, block_tokens, kv_dim) +
                       kvh * head_dim;
        float acc = 0.0f;
        for (u32 d = lane; d < head_dim; d += 32u) acc += q[d] * f16_to_f32(k[d]);
        acc = warp_sum(acc);
        if (lane == 0u) sc[p] = acc * scale;
    }
    __syncthreads();

    // 3. Softmax, probabilities rounded to f16.
    float m = NEG_INF;
    for (u32 p = tid; p < visible; p += blockDim.x) m = fmaxf(m, sc[p]);
    m = block_max(m, scratch);
    float sum = 0.0f;
    for (u32 p = tid; p < visible; p += blockDim.x) {
        const float e = expf(sc[p] - m);
        sc[p] = e;
        sum += e;
    }
    sum = block_sum(sum, scratch);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (u32 p = tid; p < visible; p += blockDim.x) sc[p] = round_f16(sc[p] * inv);
    __syncthreads();

    // 4. Σ p v: `groups` runs of head_dim threads split the positions, then add up.
    const u32 groups = blockDim.x / head_dim;
    const u32 g = tid / head_dim, d = tid % head_dim;
    float acc = 0.0f;
    if (g < groups) {
        for (u32 p = g; p < visible; p += groups) {
            const u16* v = kv + kv_row(table[p / block_tokens], 1u, layer, p % block_tokens, layers, block_tokens,
                                       kv_dim) + kvh * head_dim;
            acc += sc[p] * f16_to_f32(v[d]);
        }
    }
    partial[tid] = acc;
    __syncthreads();
    if (tid < head_dim) {
        float total = 0.0f;
        for (u32 k = 0; k < groups; ++k) total += partial[k * head_dim + tid];
        o[tid] = total;
    }
}
