/* How fast this machine streams memory into the cores: the ceiling for decode, which reads
 * every weight once per token. Sums SIZE MiB (huge pages, MADV_HUGEPAGE) with 512-bit
 * loads, 256 bytes per iteration into two accumulators, split evenly over 1 then 2
 * threads; best of seven passes each. Prints GB/s (10^9 bytes per second).
 *
 *   gcc -O2 -mavx512f -pthread -o /tmp/read_bandwidth scripts/bench/read_bandwidth.c
 *   /tmp/read_bandwidth 256      # more than the last-level cache, as the weights are
 *
 * On a host without AVX-512, build with -mavx2 -DAVX2 (the same loop with 256-bit loads). */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static char *buf;
static size_t len;
static int threads;
static long long sink[2];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *sum_share(void *arg) {
    long id = (long)arg;
    size_t share = len / threads;
    const char *p = buf + id * share;
#ifdef AVX2
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t i = 0; i < share; i += 128) {
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i + 64)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    __m256i s = _mm256_add_epi64(a, b);
    sink[id] = _mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 3);
#else
    __m512i a = _mm512_setzero_si512(), b = a;
    for (size_t i = 0; i < share; i += 256) {
        a = _mm512_add_epi64(a, _mm512_load_si512(p + i));
        b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 64));
        a = _mm512_add_epi64(a, _mm512_load_si512(p + i + 128));
        b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 192));
    }
    sink[id] = _mm512_reduce_add_epi64(_mm512_add_epi64(a, b));
#endif
    return NULL;
}

int main(int argc, char **argv) {
    len = (size_t)(argc > 1 ? atol(argv[1]) : 256) << 20;
    buf = aligned_alloc(2 << 20, len);
    if (!buf) {
        perror("aligned_alloc");
        return 2;
    }
    madvise(buf, len, MADV_HUGEPAGE);
    memset(buf, 1, len);
    for (threads = 1; threads <= 2; threads++) {
        double best = 1e30;
        for (int pass = 0; pass < 7; pass++) {
            double t0 = now();
            pthread_t t[2];
            for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, sum_share, (void *)i);
            for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        printf("%d thread(s): %.1f GB/s (checksum %lld)\n", threads, len / best / 1e9, sink[0]);
    }
    return 0;
}
