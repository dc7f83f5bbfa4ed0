// sampling.cu — what sampling needs from a row of logits, computed where the logits are:
//   pick_partial,  log Z and the entropy H = ln Z' - E[l - max] (nats) of each row, summed
//   pick_final:    in f64 as sample.rs does, and its pick: the argmax (lowest id on ties)
//                  of the row with its adjustments (logit bias, penalties) added, each id's
//                  in the order given as sample.rs's Sampler adds them, with the raw logit
//                  there. In two stages so that a few rows still spread over many SMs:
//                  chunks of the vocabulary first (a running max per chunk, rescaled when
//                  the chunks are combined), then one warp per row;
//   log_softmax:   logprob[i] = l[i] - log Z;
//   softmax:       p[i] = e^(l[i] - max) / Σ, in place;
//   top_k:         the k (<= 32) largest logits, largest first, ties by lower id.
//
// Launch: pick_partial grid = (ceil(vocab / chunk), rows, 1), block = (256, 1, 1);
//         pick_final grid = (rows, 1, 1), block = (32, 1, 1); top_k grid = (rows, 1, 1),
//         block = (1024, 1, 1); the others grid = (rows, 1, 1), block = (256, 1, 1).
// Tensors: logits f32 [rows, vocab]; part f64 [rows, chunks, PICK_PARTS]; log_z, entropy,
//          pick_logit f32 [rows]; argmax u32 [rows]; out f32 [rows, vocab]; top_ids u32
//          [rows, k], top_values f32 [rows, k]; adjustments: spans u32 [rows + 1] (row r
//          owns entries spans[r]..spans[r+1]), ids u32 and deltas f32 [spans[rows]], each
//          row's entries sorted by id with equal ids in the order they are added.

// Per chunk: max, Σ e^(l - max), Σ e^(l - max)(l - max), best adjusted value, its id.
#define PICK_PARTS 5u

__device__ double block_sum_f64(double v, double* scratch) {
    const u32 warp = threadIdx.x / 32u, lane = threadIdx.x & 31u;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0u) scratch[warp] = v;
    __syncthreads();
    double t = lane < blockDim.x / 32u ? scratch[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

// The (value, id) pair that wins: larger value, then lower id. NaN never wins.
__device__ __forceinline__ void better(float& v, u32& id, float ov, u32 oid) {
    if (ov > v || (ov == v && oid < id)) {
        v = ov;
        id = oid;
    }
}

__device__ void block_argmax(float& v, u32& id, float* sv, u32* si) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const u32 oid = __shfl_xor_sync(0xffffffffu, id, o);
        better(v, id, ov, oid);
    }
    const u32 warp = threadIdx.x / 32u, lane = threadIdx.x & 31u;
    __syncthreads();
    if (lane == 0u) {
        sv[warp] = v;
        si[warp] = id;
    }
    __syncthreads();
    v = lane < blockDim.x / 32u ? sv[lane] : NEG_INF;
    id = lane < blockDim.x / 32u ? si[lane] : 0xffffffffu;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const u32 oid = __shfl_xor_sync(0xffffffffu, id, o);
        better(v, id, ov, oid);
    }
}

// Whether `id` is adjusted in `row`, and the adjusted logit if so: binary search of the
// row's sorted ids, then its run of deltas added in order to `l`.
__device__ __forceinline__ bool adjusted(float l, u32 id, const u32* ids, const float* deltas, u32 from, u32 to,
                                         float& v) {
    u32 lo = from, hi = to;
    while (lo < hi) {
        const u32 mid = (lo + hi) / 2u;
        if (ids[mid] < id) lo = mid + 1u; else hi = mid;
    }
    if (lo >= to || ids[lo] != id) return false;
    v = l;
    for (u32 e = lo; e < to && ids[e] == id; ++e) v += deltas[e];
    return true;
}

// Stage 1 of a row's statistics and pick, over one chunk of the vocabulary: the chunk's
// raw max m, Σ e^(l - m) and Σ e^(l - m)(l - m) (f64), and its best adjusted (value, id).
extern "C" __global__ void pick_partial(const float* logits, u32 vocab, u32 chunk, const u32* spans, const u32* ids,
                                        const float* deltas, double* part) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ double sd[32];
    const u64 row = blockIdx.y;
    const float* l = logits + row * vocab;
    const u32 begin = blockIdx.x * chunk;
    const u32 end = begin + chunk < vocab ? begin + chunk : vocab;
    const u32 from = spans[row], to = spans[row + 1];
    float best = NEG_INF, m = NEG_INF;
    u32 best_id = 0xffffffffu;
    for (u32 i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const float x = l[i];
        m = fmaxf(m, x);
        float v = x;
        if (from < to) adjusted(x, i, ids, deltas, from, to, v);
        better(best, best_id, v, i);
    }
    block_argmax(best, best_id, sv, si);
    m = block_max(m, sv);
    double z = 0.0, zl = 0.0;
    for (u32 i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const double x = (double)(l[i] - m);
        const double e = exp(x);
        z += e;
        zl += e * x;
    }
    z = block_sum_f64(z, sd);
    zl = block_sum_f64(zl, sd);
    if (threadIdx.x == 0) {
        double* p = part + (row * gridDim.x + blockIdx.x) * PICK_PARTS;
        p[0] = (double)m;
        p[1] = z;
        p[2] = zl;
        p[3] = (double)best;
        p[4] = (double)best_id;
    }
}

// Stage 2: one warp per row combines the chunks: log Z = M + ln Σ z_c e^(m_c - M), entropy
// = ln Z' - Σ e^(m_c - M)(zl_c + (m_c - M) z_c) / Z', and the best adjusted pick (lowest id
// on ties) with its raw logit.
extern "C" __global__ void pick_final(const double* part, u32 chunks, const float* logits, u32 vocab, float* log_z,
                                      float* entropy, u32* argmax, float* pick_logit) {
    const u64 row = blockIdx.x;
    const u32 lane = threadIdx.x & 31u;
    const double* p = part + row * chunks * PICK_PARTS;
    float mm = NEG_INF, best = NEG_INF;
    u32 best_id = 0xffffffffu;
    for (u32 c = lane; c < chunks; c += 32u) {
        mm = fmaxf(mm, (float)p[c * PICK_PARTS]);
        better(best, best_id, (float)p[c * PICK_PARTS + 3], (u32)p[c * PICK_PARTS + 4]);
    }
    const float big = warp_max(mm);
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const u32 oid = __shfl_xor_sync(0xffffffffu, best_id, o);
        better(best, best_id, ov, oid);
    }
    double z = 0.0, zl = 0.0;
    for (u32 c = lane; c < chunks; c += 32u) {
        const double shift = p[c * PICK_PARTS] - (double)big;
        const double scale = exp(shift);
        z += p[c * PICK_PARTS + 1] * scale;
        zl += scale * (p[c * PICK_PARTS + 2] + shift * p[c * PICK_PARTS + 1]);
    }
    for (int o = 16; o > 0; o >>= 1) {
        z += __shfl_xor_sync(0xffffffffu, z, o);
        zl += __shfl_xor_sync(0xffffffffu, zl, o);
    }
    if (lane == 0u) {
        const double lz = log(z);
        const u32 id = best_id < vocab ? best_id : 0u;
        log_z[row] = big + (float)lz;
        entropy[row] = (float)(lz - zl / z);
        argmax[row] = id;
        pick_logit[row] = logits[row * vocab + id];
    }
}

extern "C" __global__ void log_softmax(const float* logits, const float* log_z, u32 vocab, float* out) {
    const u64 row = blockIdx.x;
    const float lz = log_z[row];
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) out[row * vocab + i] = logits[row * vocab + i] - lz;
}

extern "C" __global__ void softmax(float* x, u32 vocab) {
    __shared__ float scratch[32];
    float* l = x + (u64)blockIdx.x * vocab;
    float m = NEG_INF;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, l[i]);
    m = block_max(m, scratch);
    float sum = 0.0f;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float e = expf(l[i] - m);
        l[i] = e;
        sum += e;
    }
    sum = block_sum(sum, scratch);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) l[i] *= inv;
}

// k rounds of a block-wide argmax, each excluding what earlier rounds took.
extern "C" __global__ void __launch_bounds__(1024) top_k(const float* logits, u32 vocab, u32 k, u32* top_ids, float* top_values) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ u32 taken[32];
    const float* l = logits + (u64)blockIdx.x * vocab;
    const u32 n = k < 32u ? k : 32u;
    for (u32 round = 0; round < n; ++round) {
        float best = NEG_INF;
        u32 best_id = 0xffffffffu;
        for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
            bool seen = false;
            for (u32 j = 0; j < round; ++j) seen |= taken[j] == i;
            if (!seen) better(best, best_id, l[i], i);
        }
        block_argmax(best, best_id, sv, si);
        if (threadIdx.x == 0) {
            taken[round] = best_id;
            top_ids[(u64)blockIdx.x * k + round] = best_id;
            top_values[(u64)blockIdx.x * k + round] = best;
        }
        __syncthreads();
    }
}
