// matmul.cu — quantized weight matrix times q8_1 activations, ggml block layouts read as
// they are in the GGUF file (the CPU backend's formats):
//   Q4_1 block (20 bytes): f16 d, f16 m, 16 bytes of nibbles (low: elements 0..16,
//                          high: 16..32); w = d * q + m.
//   Q8_0 block (34 bytes): f16 d, 32 int8; w = d * q.
// Per block the product is integer (__dp4a) and scaled as the CPU does it:
//   Q4_1: d * a.d * Σ q·qa + m * a.s      Q8_0: d * a.d * Σ q·qa
//
//   out[t, col_offset + r] (+)= Σ_c w[r, c] * a[t, c]
//
// `matvec_*` is the decode case (one token per warp), `matmul_*` the prefill / batched
// case (a warp reads each weight block once for TILE tokens). `accumulate` != 0 adds to
// `out` (the residual stream) instead of overwriting it. With `staged` != 0 the CTA first
// copies its TILE tokens' activation blocks into shared memory, so its 8 warps read them
// from there instead of each from L2 (the host stages when the tile fits).
//
// Launch: grid = (ceil(rows / 8), ceil(tokens / TILE), 1), block = (256, 1, 1), dynamic
//         shared memory TILE * cols / 32 * sizeof(Q8_1) bytes when staged, else 0;
//         one warp per weight row and token tile, lanes stride over the row's blocks.
//         TILE = 1 (matvec_*) or 16 (matmul_*).
// Tensors: w    u8   [rows, cols / 32 * block_bytes]   (ggml rows, back to back)
//          a    Q8_1 [tokens, cols / 32]
//          out  f32  [tokens, ld_out]                  (columns col_offset .. + rows)

#define MATMUL_TILE 16

struct Q4_1Format {
    static constexpr u32 bytes = 20;
    __device__ static float dot(const u8* blk, const Q8_1& a) {
        const float d = f16_to_f32(load_u16(blk));
        const float m = f16_to_f32(load_u16(blk + 2));
        const u32* q = (const u32*)(blk + 4);  // 4-byte aligned: 20-byte blocks, aligned rows
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 w = q[i];
            sumi = __dp4a((int)(w & 0x0f0f0f0fu), a.qs[i], sumi);
            sumi = __dp4a((int)((w >> 4) & 0x0f0f0f0fu), a.qs[4 + i], sumi);
        }
        return d * a.d * (float)sumi + m * a.s;
    }
};

struct Q8_0Format {
    static constexpr u32 bytes = 34;
    __device__ static float dot(const u8* blk, const Q8_1& a) {
        const float d = f16_to_f32(load_u16(blk));
        const u8* q = blk + 2;  // 2-byte aligned only: read as u16 pairs
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 w = (u32)load_u16(q + 4 * i) | ((u32)load_u16(q + 4 * i + 2) << 16);
            sumi = __dp4a((int)w, a.qs[i], sumi);
        }
        return d * a.d * (float)sumi;
    }
};

extern __shared__ int matmul_tile[];

template <typename F, int TILE>
__device__ void matmul_rows(const u8* w, u32 rows, u32 cols, const Q8_1* a, u32 tokens, float* out, u32 ld_out,
                            u32 col_offset, u32 accumulate, u32 staged) {
    const u32 lane = threadIdx.x & 31u;
    const u32 r = blockIdx.x * (blockDim.x / 32u) + threadIdx.x / 32u;
    const u32 t0 = blockIdx.y * TILE;
    const u32 nb = cols / 32u;
    const Q8_1* at = a + (u64)t0 * nb;  // this tile's activations, [TILE, nb]
    if (staged) {
        const u32 n_t = tokens - t0 < (u32)TILE ? tokens - t0 : (u32)TILE;
        const u32 words = n_t * nb * (u32)(sizeof(Q8_1) / 4u);
        const int* src = (const int*)at;
        for (u32 i = threadIdx.x; i < words; i += blockDim.x) matmul_tile[i] = src[i];
        __syncthreads();
        at = (const Q8_1*)matmul_tile;
    }
    if (r >= rows) return;
    const u8* row = w + (u64)r * nb * F::bytes;
    float acc[TILE];
#pragma unroll
    for (int k = 0; k < TILE; ++k) acc[k] = 0.0f;
    for (u32 b = lane; b < nb; b += 32u) {
        const u8* blk = row + (u64)b * F::bytes;
#pragma unroll
        for (int k = 0; k < TILE; ++k) {
            if (t0 + k < tokens) acc[k] += F::dot(blk, at[(u64)k * nb + b]);
        }
    }
#pragma unroll
    for (int k = 0; k < TILE; ++k) {
        const float v = warp_sum(acc[k]);
        if (lane == 0u && t0 + k < tokens) {
            float* o = &out[(u64)(t0 + k) * ld_out + col_offset + r];
            *o = accumulate ? *o + v : v;
        }
    }
}

extern "C" __global__ void matvec_q4_1(const u8* w, u32 rows, u32 cols, const Q8_1* a, u32 tokens, float* out,
                                       u32 ld_out, u32 col_offset, u32 accumulate, u32 staged) {
    matmul_rows<Q4_1Format, 1>(w, rows, cols, a, tokens, out, ld_out, col_offset, accumulate, staged);
}

extern "C" __global__ void matmul_q4_1(const u8* w, u32 rows, u32 cols, const Q8_1* a, u32 tokens, float* out,
                                       u32 ld_out, u32 col_offset, u32 accumulate, u32 staged) {
    matmul_rows<Q4_1Format, MATMUL_TILE>(w, rows, cols, a, tokens, out, ld_out, col_offset, accumulate, staged);
}

extern "C" __global__ void matvec_q8_0(const u8* w, u32 rows, u32 cols, const Q8_1* a, u32 tokens, float* out,
                                       u32 ld_out, u32 col_offset, u32 accumulate, u32 staged) {
    matmul_rows<Q8_0Format, 1>(w, rows, cols, a, tokens, out, ld_out, col_offset, accumulate, staged);
}

extern "C" __global__ void matmul_q8_0(const u8* w, u32 rows, u32 cols, const Q8_1* a, u32 tokens, float* out,
                                       u32 ld_out, u32 col_offset, u32 accumulate, u32 staged) {
    matmul_rows<Q8_0Format, MATMUL_TILE>(w, rows, cols, a, tokens, out, ld_out, col_offset, accumulate, staged);
}
