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
// Work split (decode is latency-bound, so every stage keeps all 256 threads busy): one
// thread per key position for the scores (16-byte loads of f16 keys, q from shared
// memory), then HEAD_DIM / 8 threads per value position (8 dimensions each, 16-byte loads)
// with 256 / (head_dim / 8) positions in flight, partial sums added in shared memory. The
// row's block table is read into shared memory once when it fits.
//
// The output goes straight to q8_1 blocks (`q8_1_warp`) for the output projection: one warp
// per 32 dimensions of the head; a refused row and head get zero blocks.
//
// Launch: grid = (n_head, rows, 1), block = (256, 1, 1); head_dim a multiple of 32, at most
//         256; kv_dim a multiple of 8 (16-byte aligned key and value rows).
// Tensors: qkv      f32  [rows, row_stride]            (queries [n_head, head_dim] at 0)
//          out      Q8_1 [rows, n_head * head_dim / 32]
//          scores   f32  [rows, n_head, max_visible]   (workspace; max_visible >= pos + 1)
//          kv       u16  [total_blocks, 2, layers, block_tokens, kv_dim]   (f16 bits)
//          tags     u32  [total_blocks]
//          tables, seqs, row_seq, row_pos, status: as in kv_append.cu

#define ATTENTION_THREADS 256u
// Block-table entries kept in shared memory (longer tables are read from global memory).
#define SHARED_TABLE 512u

// 8 f16 values at a 16-byte aligned address, as f32.
__device__ __forceinline__ void load8_f16(const u16* p, float* out) {
    const uint4 raw = *(const uint4*)p;
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = f16_to_f32((u16)(w[i] & 0xffffu));
        out[2 * i + 1] = f16_to_f32((u16)(w[i] >> 16));
    }
}

extern "C" __global__ void __launch_bounds__(256) paged_attention(
    const float* qkv, u32 row_stride, Q8_1* out, float* scores, u32 max_visible, const u16* kv, const u32* tags,
    const u32* tables, const u32* seqs, const u32* row_seq, const u32* row_pos, u32* status, u32 layer, u32 layers,
    u32 block_tokens, u32 kv_dim, u32 total_blocks, u32 n_head, u32 n_head_kv, u32 head_dim, float scale,
    u32 check_owner, u32 check_bounds) {
    __shared__ u32 refused;
    __shared__ float q[256];
    // [groups, head_dim]: groups * head_dim = 8 * ATTENTION_THREADS whatever head_dim is.
    __shared__ float partial[ATTENTION_THREADS * 8u];
    __shared__ float scratch[32];
    __shared__ u32 shared_table[SHARED_TABLE];
    const u32 head = blockIdx.x, row = blockIdx.y, tid = threadIdx.x;
    const u32 warp = tid / 32u, lane = tid & 31u;
    const u32 s = row_seq[row], pos = row_pos[row];
    const u32* seq = seqs + s * SEQ_FIELDS;
    const u32* table = tables + seq[SEQ_TABLE_AT];
    const u32 table_len = seq[SEQ_TABLE_LEN];
    const u32 visible = pos + 1u;
    const u32 n_blocks = (visible + block_tokens - 1u) / block_tokens;
    Q8_1* o = out + ((u64)row * n_head * head_dim + (u64)head * head_dim) / 32u;

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
        } else if (i < SHARED_TABLE) {
            shared_table[i] = table[i];
        }
    }
    __syncthreads();
    if (refused) {
        if (warp < head_dim / 32u) {
            if (lane < 8u) o[warp].qs[lane] = 0;
            if (lane == 0u) o[warp].d = o[warp].s = 0.0f;
        }
        return;
    }
    const u32* blocks = n_blocks <= SHARED_TABLE ? shared_table : table;

    // 2. Scores: one thread per key position.
    const u32 kvh = head / (n_head / n_head_kv);
    for (u32 d = tid; d < head_dim; d += blockDim.x) q[d] = round_f16(qkv[(u64)row * row_stride + head * head_dim + d]);
    __syncthreads();
    float* sc = scores + ((u64)row * n_head + head) * max_visible;
    for (u32 p = tid; p < visible; p += blockDim.x) {
        const u16* k = kv + kv_row(blocks[p / block_tokens], 0u, layer, p % block_tokens, layers, block_tokens, kv_dim) +
                       kvh * head_dim;
        float acc = 0.0f;
        for (u32 d = 0; d < head_dim; d += 8u) {
            float kf[8];
            load8_f16(k + d, kf);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc += q[d + i] * kf[i];
        }
        sc[p] = acc * scale;
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

    // 4. Σ p v: head_dim / 8 threads per position, 8 dimensions each.
    const u32 per_pos = head_dim / 8u;
    const u32 groups = blockDim.x / per_pos;
    const u32 g = tid / per_pos, d0 = (tid % per_pos) * 8u;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
    if (g < groups) {
        for (u32 p = g; p < visible; p += groups) {
            const u16* v = kv + kv_row(blocks[p / block_tokens], 1u, layer, p % block_tokens, layers, block_tokens,
                                       kv_dim) + kvh * head_dim + d0;
            float vf[8];
            load8_f16(v, vf);
            const float w = sc[p];
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] += w * vf[i];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) partial[g * head_dim + d0 + i] = acc[i];
    }
    __syncthreads();

    // 5. Add the groups up and quantize: warp w holds dimensions 32w .. 32w + 31.
    if (warp < head_dim / 32u) {
        const u32 d = warp * 32u + lane;
        float total = 0.0f;
        for (u32 k = 0; k < groups; ++k) total += partial[k * head_dim + d];
        q8_1_warp(total, &o[warp]);
    }
}
