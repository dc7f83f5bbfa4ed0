// rms_norm.cu — RMSNorm of rows: out = x / sqrt(mean(x²) + eps) * weight, with the squares
// summed in f64 as the CPU backend (and the reference) does.
//
// `rms_norm_rows` normalises every row; `rms_norm_gather` normalises the rows `row_ids`
// lists (each sequence's last token before the output head) into consecutive out rows.
//
// Launch: grid = (out_rows, 1, 1), block = (256, 1, 1); threads stride over the columns.
// Tensors: x       f32 [rows, cols]
//          weight  f32 [cols]
//          row_ids u32 [out_rows]                (gather only)
//          out     f32 [out_rows, cols]

__device__ void rms_norm_row(const float* x, const float* weight, float eps, u32 cols, float* out) {
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
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) out[c] = x[c] * scale * weight[c];
}

extern "C" __global__ void rms_norm_rows(const float* x, const float* weight, float eps, u32 cols, float* out) {
    const u64 row = blockIdx.x;
    rms_norm_row(x + row * cols, weight, eps, cols, out + row * cols);
}

extern "C" __global__ void rms_norm_gather(const float* x, const u32* row_ids, const float* weight, float eps, u32 cols,
                                           float* out) {
    const u64 row = row_ids[blockIdx.x];
    rms_norm_row(x + row * cols, weight, eps, cols, out + (u64)blockIdx.x * cols);
}
