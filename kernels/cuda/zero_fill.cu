// zero_fill.cu — zero one KV block a sequence released and clear its owner tag, before the
// pool can hand the block out again.
//
// Launch: grid = (64, 1, 1), block = (256, 1, 1); the CTAs stride over the block's words.
// Tensors: kv    u32 [total_blocks, block_words]  (the device KV pool viewed as words;
//                                                  a block is [2, layers, block_tokens, kv_dim] f16)
//          tags  u32 [total_blocks]               (owner tag per block; 0 = nobody)
// Stream order guarantees the zeroes land before any kernel of a later step reads or
// writes the block: the engine issues everything on one stream.
extern "C" __global__ void zero_fill_block(u32* kv, u32* tags, u32 id, u64 block_words, u32 total_blocks) {
    if (id >= total_blocks) return;  // never write outside the pool
    u32* base = kv + (u64)id * block_words;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < block_words; i += (u64)gridDim.x * blockDim.x) {
        base[i] = 0u;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) tags[id] = 0u;
}
