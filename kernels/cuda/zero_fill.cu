// zero_fill.cu — zero the KV blocks a request released, before the pool can hand them out.
//
// Launch: grid = (n_blocks, 1, 1), block = (256, 1, 1); one CUDA block per KV block.
// Tensors: kv      f32 [total_blocks, block_floats]   (the pool's K or V storage)
//          ids     u32 [n_blocks]                      (pool indices of released blocks)
// Stream order guarantees the zeroes land before any later allocation's kernels run.
extern "C" __global__ void zero_fill_blocks_f32(float* kv,
                                                const unsigned int* ids,
                                                unsigned int n_blocks,
                                                unsigned long long block_floats,
                                                unsigned int total_blocks) {
    unsigned int b = blockIdx.x;
    if (b >= n_blocks) return;
    unsigned int id = ids[b];
    if (id >= total_blocks) return;  // never write outside the pool
    float* base = kv + (unsigned long long)id * block_floats;
    for (unsigned long long i = threadIdx.x; i < block_floats; i += blockDim.x) {
        base[i] = 0.0f;
    }
}
