// embed.cu — the token embedding: dequantize one row of the embedding matrix per token,
// as the CPU backend's `Matrix::dequantize_row` does (Q4_1: d * q + m; Q8_0: d * q).
//
// Launch: grid = (tokens, 1, 1), block = (256, 1, 1); threads stride over the columns.
// Tensors: w    u8  [vocab, cols / 32 * block_bytes]   (ggml rows)
//          ids  u32 [tokens]                          (checked < vocab by the host; a
//                                                      larger id yields a zero row)
//          out  f32 [tokens, cols]
extern "C" __global__ void embed_q4_1(const u8* w, const u32* ids, u32 vocab, u32 cols, float* out) {
    const u32 t = blockIdx.x;
    const u32 id = ids[t];
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = 0.0f;
        if (id < vocab) {
            const u8* blk = w + ((u64)id * (cols / 32u) + c / 32u) * 20u;
            const u32 j = c % 32u;
            const u8 byte = blk[4 + (j & 15u)];
            const u32 q = j < 16u ? (byte & 0x0fu) : (byte >> 4);
            v = f16_to_f32(load_u16(blk)) * (float)q + f16_to_f32(load_u16(blk + 2));
        }
        out[(u64)t * cols + c] = v;
    }
}

extern "C" __global__ void embed_q8_0(const u8* w, const u32* ids, u32 vocab, u32 cols, float* out) {
    const u32 t = blockIdx.x;
    const u32 id = ids[t];
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = 0.0f;
        if (id < vocab) {
            const u8* blk = w + ((u64)id * (cols / 32u) + c / 32u) * 34u;
            v = f16_to_f32(load_u16(blk)) * (float)(signed char)blk[2 + c % 32u];
        }
        out[(u64)t * cols + c] = v;
    }
}
