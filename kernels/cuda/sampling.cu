// sampling.cu — what sampling needs from a row of logits, computed where the logits are:
//   logits_stats:  log Z = max + ln Σ e^(l - max), entropy H = ln Z' - E[l - max] (nats),
//                  both accumulated in f64 as sample.rs does, and the argmax (lowest id
//                  on ties);
//   log_softmax:   logprob[i] = l[i] - log Z;
//   softmax:       p[i] = e^(l[i] - max) / Σ, in place;
//   top_k:         the k (<= 32) largest logits, largest first, ties by lower id.
//
// Launch: grid = (rows, 1, 1), block = (1024, 1, 1) for logits_stats and top_k, (256, 1, 1)
//         for the others; threads stride over the vocabulary.
// Tensors: logits f32 [rows, vocab]; log_z, entropy f32 [rows]; argmax u32 [rows];
//          out f32 [rows, vocab]; top_ids u32 [rows, k], top_values f32 [rows, k].

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

extern "C" __global__ void __launch_bounds__(1024) logits_stats(const float* logits, u32 vocab, float* log_z, float* entropy, u32* argmax) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ double sd[32];
    const float* l = logits + (u64)blockIdx.x * vocab;
    float best = NEG_INF;
    u32 best_id = 0xffffffffu;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) better(best, best_id, l[i], i);
    block_argmax(best, best_id, sv, si);
    const float m = best;
    double z = 0.0, zl = 0.0;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        const double x = (double)(l[i] - m);
        const double e = exp(x);
        z += e;
        zl += e * x;
    }
    z = block_sum_f64(z, sd);
    zl = block_sum_f64(zl, sd);
    if (threadIdx.x == 0) {
        const double lz = log(z);
        log_z[blockIdx.x] = m + (float)lz;
        entropy[blockIdx.x] = (float)(lz - zl / z);
        argmax[blockIdx.x] = best_id == 0xffffffffu ? 0u : best_id;
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
