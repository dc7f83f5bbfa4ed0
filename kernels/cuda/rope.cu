// rope.cu — rotary position embedding of the query and key heads of each row, in place:
// the "normal" (adjacent pairs) RoPE of llama.cpp's LLM_ARCH_LLAMA, as forward.rs applies
// it: pair (x[2i], x[2i+1]) of each head's leading 2 * pairs dims rotates by theta_i(pos):
//   x0' = x0 cos - x1 sin,  x1' = x0 sin + x1 cos.
// The angles come from a table the host builds with the CPU's own `ops::rope_table`
// (theta built by repeated multiplication), so both backends rotate by identical values.
//
// Launch: grid = (rows, 1, 1), block = (256, 1, 1); threads stride over (head, pair).
// Tensors: qkv    f32 [rows, row_stride]   (queries [n_q_heads, head_dim] at 0, keys
//                                          [n_kv_heads, head_dim] at n_q_heads * head_dim)
//          table  f32 [max_pos, pairs, 2]  (cos, sin)
//          pos    u32 [rows]               (absolute position of each row; rows at or
//                                          past max_pos are left alone: the host never
//                                          schedules them)
extern "C" __global__ void rope_qk(float* qkv, const float* table, const u32* pos, u32 max_pos, u32 row_stride,
                                   u32 n_q_heads, u32 n_kv_heads, u32 head_dim, u32 pairs) {
    const u32 row = blockIdx.x;
    const u32 p = pos[row];
    if (p >= max_pos) return;
    float* x = qkv + (u64)row * row_stride;
    const float* angles = table + (u64)p * pairs * 2u;
    const u32 work = (n_q_heads + n_kv_heads) * pairs;
    for (u32 i = threadIdx.x; i < work; i += blockDim.x) {
        const u32 head = i / pairs, k = i % pairs;
        float* h = x + head * head_dim;  // keys follow queries directly
        const float c = angles[2u * k], s = angles[2u * k + 1u];
        const float a = h[2u * k], b = h[2u * k + 1u];
        h[2u * k] = a * c - b * s;
        h[2u * k + 1u] = a * s + b * c;
    }
}
