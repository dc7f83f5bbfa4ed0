// quantize.cu — quantize f32 activation rows to q8_1 blocks for the integer products of
// matmul.cu, with the CPU backend's rule: amax over 32 values, d = amax / 127,
// q = round-half-even(x * (127 / amax)), d and s = d * Σq rounded to f16.
//
// Launch: grid = (ceil(cols / 32 / 8), rows, 1), block = (256, 1, 1); one warp per block
//         of 32 values, one lane per value.
// Tensors: x  f32  [rows, cols]        (cols a multiple of 32)
//          y  Q8_1 [rows, cols / 32]
extern "C" __global__ void quantize_q8_1(const float* x, Q8_1* y, u32 rows, u32 cols) {
    const u32 lane = threadIdx.x & 31u;
    const u32 nb = cols / 32u;
    const u32 b = blockIdx.x * (blockDim.x / 32u) + threadIdx.x / 32u;
    const u32 row = blockIdx.y;
    if (row >= rows || b >= nb) return;  // whole warps leave together
    const float v = x[(u64)row * cols + b * 32u + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = (int)rintf(v * id);
    const int isum = warp_sum_int(q);
    // Pack lanes 4k..4k+3 into int k.
    const int q1 = __shfl_down_sync(0xffffffffu, q, 1);
    const int q2 = __shfl_down_sync(0xffffffffu, q, 2);
    const int q3 = __shfl_down_sync(0xffffffffu, q, 3);
    Q8_1* out = &y[(u64)row * nb + b];
    if ((lane & 3u) == 0u) {
        out->qs[lane / 4u] = (q & 0xff) | ((q1 & 0xff) << 8) | ((q2 & 0xff) << 16) | ((u32)(q3 & 0xff) << 24);
    }
    if (lane == 0u) {
        out->d = round_f16(d);
        out->s = round_f16(d * (float)isum);
    }
}
