// swiglu.cu — the SwiGLU of the feed-forward block, h = silu(gate) * up with silu(g) =
// g / (1 + e^-g), quantized straight to the q8_1 blocks the down projection reads.
//
// Launch: grid = (ceil(n_ff / 32 / 8), rows, 1), block = (256, 1, 1); one warp per q8_1
//         block of 32 outputs, one lane per output.
// Tensors: gu  f32  [rows, 2 * n_ff]   (gate in columns 0..n_ff, up in n_ff..2 n_ff)
//          y   Q8_1 [rows, n_ff / 32]  (n_ff a multiple of 32)
extern "C" __global__ void swiglu_q8_1(const float* gu, Q8_1* y, u32 n_ff) {
    const u32 nb = n_ff / 32u;
    const u32 b = blockIdx.x * (blockDim.x / 32u) + threadIdx.x / 32u;
    const u64 row = blockIdx.y;
    if (b >= nb) return;  // whole warps leave together
    const u32 i = b * 32u + (threadIdx.x & 31u);
    const float g = gu[row * 2u * n_ff + i];
    const float u = gu[row * 2u * n_ff + n_ff + i];
    q8_1_warp(g / (1.0f + expf(-g)) * u, &y[row * nb + b]);
}
