// rms_norm.cu — RMSNorm of rows, out = x / sqrt(mean(x²) + eps) * weight, with the squares
// summed in f64 as the CPU backend (and the reference) does, quantized straight to the
// q8_1 blocks the next matrix product reads (`q8_1_warp`).
//
// `rms_norm_q8_1_rows` normalises every row; `rms_norm_q8_1_gather` normalises the rows
// `row_ids` lists (each sequence's last token before the output head) into consecutive
// out rows.
//
// Launch: grid = (out_rows, 1, 1), block = (256, 1, 1); threads stride over the columns
//         for the sum, then each warp quantizes every 8th block of 32.
// Tensors: x       f32  [rows, cols]     (cols a multiple of 32)
//          weight  f32  [cols]
//          row_ids u32  [out_rows]       (gather only)
//          y       Q8_1 [out_rows, cols / 32]

__device__ void rms_norm_q8_1_row(const float* x, const float* weight, float eps, u32 cols, Q8_1* y) {
    __shared__ double partial[32];
    double sum = 0.0;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = x[c];
        sum += (double)(v * v);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const u32 warp = threadIdx.x / 32u, lane = threadIdx.x & 31u;
    if (lane == 0u) partial[warp] = sum;
    __syncthreads();
    if (warp == 0u) {
        double s = lane < blockDim.x / 32u ? partial[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0u) partial[0] = s;
    }
    __syncthreads();
    const float mean = (float)(partial[0] / (double)cols);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (u32 b = warp; b < cols / 32u; b += blockDim.x / 32u) {
        const u32 c = b * 32u + lane;
        q8_1_warp(x[c] * scale * weight[c], &y[b]);
    }
}

extern "C" __global__ void rms_norm_q8_1_rows(const float* x, const float* weight, float eps, u32 cols, Q8_1* y) {
    const u64 row = blockIdx.x;
    rms_norm_q8_1_row(x + row * cols, weight, eps, cols, y + row * (cols / 32u));
}

extern "C" __global__ void rms_norm_q8_1_gather(const float* x, const u32* row_ids, const float* weight, float eps,
                                                u32 cols, Q8_1* y) {
    const u64 row = row_ids[blockIdx.x];
    rms_norm_q8_1_row(x + row * cols, weight, eps, cols, y + (u64)blockIdx.x * (cols / 32u));
}
