// common.cuh — helpers every kernel family shares. kernels/src/lib.rs prepends this text to
// each family's source, so NVRTC compiles one self-contained translation unit per family
// (no include paths, no CUDA headers: f16 conversions are single PTX instructions).
//
// Numerics: the engine compiles with --fmad=false so that `a * b + c` rounds twice, as
// the CPU backend does; products and sums then differ from the CPU only in summation order.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// -inf without math.h (NVRTC compiles with no headers).
#define NEG_INF (__int_as_float(0xff800000))

// IEEE half (bit pattern) -> f32.
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> IEEE half (bit pattern), round to nearest even (as the `half` crate does).
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// Little-endian u16 at a 2-byte aligned address.
__device__ __forceinline__ u16 load_u16(const u8* p) { return *(const u16*)p; }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// 32 activations quantized to 8 bits: llama.cpp's q8_1, as the CPU backend's `Q8Block`.
// d = amax / 127 and s = d * Σ qs, both at f16 precision; qs packed four to an int so
// that __dp4a multiplies four at a time.
struct Q8_1 {
    float d;
    float s;
    int qs[8];
};

// One warp quantizes its 32 lanes' values `v` (lane i holds element i) into `out`, with
// the CPU backend's rule: amax over the 32, d = amax / 127, q = round-half-even(v * 127 /
// amax), d and s = d * Σq rounded to f16; lanes 4k..4k+3 pack little-endian into qs[k].
// Every lane of the warp must call it.
__device__ __forceinline__ void q8_1_warp(float v, Q8_1* out) {
    const u32 lane = threadIdx.x & 31u;
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = (int)rintf(v * id);
    const int isum = warp_sum_int(q);
    const int q1 = __shfl_down_sync(0xffffffffu, q, 1);
    const int q2 = __shfl_down_sync(0xffffffffu, q, 2);
    const int q3 = __shfl_down_sync(0xffffffffu, q, 3);
    if ((lane & 3u) == 0u) {
        out->qs[lane / 4u] = (q & 0xff) | ((q1 & 0xff) << 8) | ((q2 & 0xff) << 16) | ((u32)(q3 & 0xff) << 24);
    }
    if (lane == 0u) {
        out->d = round_f16(d);
        out->s = round_f16(d * (float)isum);
    }
}

// KV isolation status of one sequence: [code, block, position]. The first violation a
// kernel sees wins (atomicCAS on the code); the host turns it into Error::Isolation.
#define KV_OK 0u
#define KV_FOREIGN_BLOCK 1u
#define KV_OUT_OF_BOUNDS 2u

__device__ __forceinline__ void kv_report(u32* status, u32 seq, u32 code, u32 block, u32 position) {
    if (atomicCAS(&status[seq * 3], KV_OK, code) == KV_OK) {
        status[seq * 3 + 1] = block;
        status[seq * 3 + 2] = position;
    }
}

// Block-wide reductions (blockDim.x a multiple of 32, at most 1024). Every thread gets the
// result. `scratch` is 32 floats of shared memory; the call synchronises the block.
__device__ float block_sum(float v, float* scratch) {
    const u32 warp = threadIdx.x / 32u, lane = threadIdx.x & 31u;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0u) scratch[warp] = v;
    __syncthreads();
    float t = lane < blockDim.x / 32u ? scratch[lane] : 0.0f;
    t = warp_sum(t);
    return t;
}

__device__ float block_max(float v, float* scratch) {
    const u32 warp = threadIdx.x / 32u, lane = threadIdx.x & 31u;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0u) scratch[warp] = v;
    __syncthreads();
    float t = lane < blockDim.x / 32u ? scratch[lane] : NEG_INF;
    return warp_max(t);
}

// One sequence of a batched step as the paged-KV kernels see it: u32 [5] per sequence.
#define SEQ_TABLE_AT 0      // first entry of its block table in `tables`
#define SEQ_TABLE_LEN 1     // entries of its table
#define SEQ_TENANT 2        // the owner tag every block it touches must carry
#define SEQ_WRITE_FROM 3    // committed length: this step writes positions from here ...
#define SEQ_READABLE 4      // ... up to here (committed + this step's tokens)
#define SEQ_FIELDS 5

// Position p of a sequence lives in block table[p / block_tokens], slot p % block_tokens.
// A block is [2 (keys, values), layers, block_tokens, kv_dim] f16.
__device__ __forceinline__ u64 kv_row(u32 id, u32 is_value, u32 layer, u32 slot, u32 layers, u32 block_tokens,
                                      u32 kv_dim) {
    const u64 block_halves = 2ull * layers * block_tokens * kv_dim;
    return (u64)id * block_halves + ((u64)(is_value * layers + layer) * block_tokens + slot) * kv_dim;
}
