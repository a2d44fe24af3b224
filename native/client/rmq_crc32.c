/*
 * zlib's CRC-32 for the pull body decoder (rmq_native.c), which checks each record's body
 * against the CRC the broker stored: eight bytes a step by table, or carry-less
 * multiplication folding where the CPU has it. crc32() exposes it so tests can hold both
 * paths against zlib.crc32.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "rmq_client.h"


static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

/* The CRC state (not inverted) advanced over n bytes, eight at a time by table. */
static uint32_t crc32_tables(uint32_t c, const uint8_t *p, Py_ssize_t n) {
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_CLMUL_PATH 1

/* Carry-less multiplication folding (Intel, "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ"), for the bit-reflected CRC-32 of zlib and RocketMQ. n >= 64 and a multiple
 * of 16; returns the advanced state. Constants are x^k mod P(x), bit-reflected. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc32_clmul(uint32_t c, const uint8_t *p, Py_ssize_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
    const __m128i poly_mu = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)c));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
#define FOLD(x, k, data) _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128((x), (k), 0x00), \
                                                     _mm_clmulepi64_si128((x), (k), 0x11)), (data))
    for (; n >= 64; p += 64, n -= 64) {
        x1 = FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)p));
        x2 = FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = FOLD(x4, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x1 = FOLD(x1, k3k4, x2);
    x1 = FOLD(x1, k3k4, x3);
    x1 = FOLD(x1, k3k4, x4);
    for (; n >= 16; p += 16, n -= 16)
        x1 = FOLD(x1, k3k4, _mm_loadu_si128((const __m128i *)p));
#undef FOLD
    /* 128 -> 64 bits (appending 32 zero bits), then 64 -> 32 by Barrett reduction. */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(k3k4, x1, 0x01));
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 4),
                       _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly_mu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly_mu, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x1, t), 1);
}

static int have_clmul = 0;

static void crc_detect(void) {
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}
#else
static void crc_detect(void) {}
#endif

/* zlib's CRC-32 of n bytes, as RocketMQ stores it (before its 0x7FFFFFFF mask). */
uint32_t rmq_crc32(const uint8_t *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
#ifdef HAVE_CLMUL_PATH
    if (have_clmul && n >= 64) {
        Py_ssize_t blocks = n & ~(Py_ssize_t)15;
        c = crc32_clmul(c, p, blocks);
        p += blocks;
        n -= blocks;
    }
#endif
    return crc32_tables(c, p, n) ^ 0xFFFFFFFFu;
}

/* crc32(data, use_clmul=True) -> int: the decoder's CRC, exposed so tests can hold both paths
 * against zlib.crc32. */
static PyObject *crc32_py(PyObject *self, PyObject *args) {
    Py_buffer view;
    int use_clmul = 1;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &use_clmul)) return NULL;
    uint32_t c;
#ifdef HAVE_CLMUL_PATH
    int saved = have_clmul;
    have_clmul = have_clmul && use_clmul;
    c = rmq_crc32((const uint8_t *)view.buf, view.len);
    have_clmul = saved;
#else
    (void)use_clmul;
    c = rmq_crc32((const uint8_t *)view.buf, view.len);
#endif
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef crc32_functions[] = {
    {"crc32", crc32_py, METH_VARARGS, "The decoder's CRC-32 of a bytes-like object."},
    {NULL, NULL, 0, NULL},
};

int rmq_crc32_register(PyObject *module) {
    crc_init();
    crc_detect();
    return PyModule_AddFunctions(module, crc32_functions);
}
