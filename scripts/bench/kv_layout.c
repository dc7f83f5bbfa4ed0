/* How fast attention's KV reads can go under each memory layout: a scratch model of one
 * decode step of the default model after ~700 tokens (44 blocks of 16 positions, 30
 * layers, 3 KV heads of 64 f16 dimensions). Between layers it streams that layer's share
 * of 96 MB of "weights", as the forward pass does, then reads every head's keys and
 * values the way attention reads them. Prints the KV and weight read rates.
 *
 *   gcc -O2 -mavx2 -o /tmp/kv_layout scripts/bench/kv_layout.c && /tmp/kv_layout MODE
 *
 * MODE 0: one allocation per block (368 KB: all layers' keys, then all layers' values,
 *         each position's value row holding the three heads side by side);
 *      1: the same layout in one arena;  2: as 1, on 2 MB pages (MADV_HUGEPAGE);
 *      3: one contiguous run per (layer, keys|values, head) across the blocks, 2 MB pages;
 *      4: as 3, on 4 KB pages (what the engine's arena does, in runs of 64 blocks). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define BLOCK 368640 /* bytes of one block: 2 x 30 layers x 16 positions x 192 x f16 */
#define BLOCKS 44
#define LAYERS 30
#define HEADS 3
#define PIECE 2048 /* one head's keys (or values) of one layer in one block */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static __m256 sink;
static void read_bytes(const char *p, size_t n) {
    for (size_t i = 0; i < n; i += 32) sink = _mm256_add_ps(sink, _mm256_loadu_ps((const float *)(p + i)));
}

int main(int argc, char **argv) {
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    char *block[BLOCKS];
    if (mode == 0) {
        for (int b = 0; b < BLOCKS; b++) {
            block[b] = malloc(BLOCK);
            memset(block[b], 1, BLOCK);
        }
    } else {
        size_t size = (size_t)BLOCKS * BLOCK, huge = 2u << 20;
        char *raw = mmap(0, size + 2 * huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        char *arena = (char *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
        if (mode == 2 || mode == 3) madvise(arena, size, MADV_HUGEPAGE);
        memset(arena, 1, size);
        for (int b = 0; b < BLOCKS; b++) block[b] = arena + (size_t)b * BLOCK;
    }
    size_t weight_bytes = 96u << 20;
    char *weights = malloc(weight_bytes);
    memset(weights, 2, weight_bytes);
    double kv_s = 0, weight_s = 0;
    int steps = 40;
    for (int step = 0; step < steps; step++) {
        for (int l = 0; l < LAYERS; l++) {
            double t0 = now();
            read_bytes(weights + (size_t)l * (weight_bytes / LAYERS), weight_bytes / LAYERS);
            double t1 = now();
            weight_s += t1 - t0;
            if (mode >= 3) {
                /* [layer][keys|values][head][block][piece]: one run per head and half. */
                char *layer = block[0] + (size_t)l * BLOCKS * 2 * HEADS * PIECE;
                for (int h = 0; h < HEADS; h++) {
                    read_bytes(layer + (size_t)h * BLOCKS * PIECE, BLOCKS * PIECE);
                    read_bytes(layer + (size_t)(HEADS + h) * BLOCKS * PIECE, BLOCKS * PIECE);
                }
            } else {
                for (int h = 0; h < HEADS; h++) {
                    for (int b = 0; b < BLOCKS; b++) read_bytes(block[b] + l * HEADS * PIECE + h * PIECE, PIECE);
                    for (int b = 0; b < BLOCKS; b++)
                        for (int p = 0; p < 16; p++) read_bytes(block[b] + BLOCK / 2 + l * HEADS * PIECE + p * 384 + h * 128, 128);
                }
            }
            kv_s += now() - t1;
        }
    }
    double kv_bytes = (double)steps * LAYERS * HEADS * BLOCKS * 2 * PIECE;
    printf("mode %d: KV %.2f GB/s, weights %.2f GB/s (%g)\n", mode, kv_bytes / kv_s / 1e9, (double)steps * weight_bytes / weight_s / 1e9, (double)sink[0]);
    return 0;
}
