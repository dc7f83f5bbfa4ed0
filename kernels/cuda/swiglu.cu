// swiglu.cu — the SwiGLU of the feed-forward block: h = silu(gate) * up, silu(g) = g / (1 + e^-g).
//
// Launch: grid = (ceil(n_ff / 256), rows, 1), block = (256, 1, 1); one thread per output.
// Tensors: gu  f32 [rows, 2 * n_ff]   (gate in columns 0..n_ff, up in n_ff..2 n_ff)
//          h   f32 [rows, n_ff]
extern "C" __global__ void swiglu(const float* gu, float* h, u32 n_ff) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u64 row = blockIdx.y;
    if (i >= n_ff) return;
    const float g = gu[row * 2u * n_ff + i];
    const float u = gu[row * 2u * n_ff + n_ff + i];
    h[row * n_ff + i] = g / (1.0f + expf(-g)) * u;
}
