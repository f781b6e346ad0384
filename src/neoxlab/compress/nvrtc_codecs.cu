/* neoxlab's fused codecs in CUDA C: ZFP fixed rate (4x4 blocks of 16 consecutive values, as
 * zfp_torch.py lays a flat tensor out) and blockwise int8/int4 (as quant.py).
 *
 * One source, two builds:
 * - the GPU: NVRTC compiles it at run time (nvrtc.py), so a node needs no host compiler and
 *   no torch headers (Lassen: CUDA 11.8, gcc 8); the __global__ kernels at the end are
 *   launched through the CUDA driver API (cuda_driver.py);
 * - the host: g++ builds it as a shared library (nvrtc_host.py), which the tests hold
 *   against zfpy and the torch reference, bit for bit.
 * Every block codec below is one function for both (NX_HD). It includes no header: NVRTC
 * ships none of the C library, so integer types, float bit casts and fp16 conversions are
 * written here. Signed int32 arithmetic that ZFP lets wrap goes through uint32 (signed
 * overflow is undefined in C++); right shifts of negative int32 are arithmetic in gcc and
 * CUDA. Floating point is IEEE round-to-nearest everywhere: NVRTC runs with --fmad=false
 * and --prec-div=true, g++ with -ffp-contract=off, so a product is never fused into an add
 * (the int8 rounding adds 1.5 * 2^23 to the product, as the Triton kernel does).
 */

#if defined(__CUDACC__)
#define NX_HD __host__ __device__ __forceinline__
#else
#define NX_HD static inline
#endif

typedef unsigned char nx_u8;
typedef unsigned short nx_u16;
typedef int nx_i32;
typedef unsigned int nx_u32;
typedef long long nx_i64;
typedef unsigned long long nx_u64;

enum { NX_F32 = 0, NX_F16 = 1, NX_BF16 = 2 };  /* the dtype codes nvrtc_kernels.py passes */

/* -- floats as bits --------------------------------------------------------------------- */

NX_HD float nx_f(nx_u32 b) { union { nx_u32 u; float f; } c; c.u = b; return c.f; }
NX_HD nx_u32 nx_b(float f) { union { nx_u32 u; float f; } c; c.f = f; return c.u; }

/* fp16 bits -> fp32, exact (subnormals normalised, NaN payload kept) */
NX_HD float nx_half_to_float(nx_u16 h) {
  nx_u32 sign = (nx_u32)(h & 0x8000u) << 16;
  nx_u32 e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return nx_f(sign | 0x7F800000u | (m << 13));
  if (e != 0) return nx_f(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return nx_f(sign);
  nx_u32 s = 0;
  while (!(m & 0x400u)) { m <<= 1; s++; }
  return nx_f(sign | ((113u - s) << 23) | ((m & 0x3FFu) << 13));
}

/* fp32 -> fp16 bits, rounded to nearest even as torch's cast does (overflow -> inf) */
NX_HD nx_u16 nx_float_to_half(float f) {
  nx_u32 x = nx_b(f), sign = (x >> 16) & 0x8000u, a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (nx_u16)(sign | 0x7E00u);
  if (a >= 0x477FF000u) return (nx_u16)(sign | 0x7C00u); /* >= 65520: rounds to inf */
  if (a >= 0x38800000u) {                                 /* a normal half */
    nx_u32 h = (a >> 13) - (112u << 10), rem = a & 0x1FFFu;
    h += (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u;
    return (nx_u16)(sign | h);
  }
  nx_u32 e = a >> 23;
  if (e < 102u) return (nx_u16)sign;                     /* below half the smallest step */
  nx_u32 m = (a & 0x7FFFFFu) | 0x800000u, shift = 126u - e;
  nx_u32 h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  h += (rem > half || (rem == half && (h & 1u))) ? 1u : 0u;
  return (nx_u16)(sign | h);
}

/* fp32 -> bf16 bits, rounded to nearest even (NaN -> the quiet NaN) */
NX_HD nx_u16 nx_float_to_bf16(float f) {
  nx_u32 x = nx_b(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return (nx_u16)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

NX_HD float nx_load(const void* p, nx_i64 i, int dt) {
  if (dt == NX_F32) return ((const float*)p)[i];
  nx_u16 h = ((const nx_u16*)p)[i];
  return dt == NX_F16 ? nx_half_to_float(h) : nx_f((nx_u32)h << 16);
}

NX_HD void nx_store(void* p, nx_i64 i, float v, int dt) {
  if (dt == NX_F32) ((float*)p)[i] = v;
  else ((nx_u16*)p)[i] = dt == NX_F16 ? nx_float_to_half(v) : nx_float_to_bf16(v);
}

/* -- ZFP: integer helpers ---------------------------------------------------------------- */

NX_HD nx_i32 nx_add(nx_i32 a, nx_i32 b) { return (nx_i32)((nx_u32)a + (nx_u32)b); }
NX_HD nx_i32 nx_sub(nx_i32 a, nx_i32 b) { return (nx_i32)((nx_u32)a - (nx_u32)b); }
NX_HD nx_i32 nx_dbl(nx_i32 a) { return (nx_i32)((nx_u32)a << 1); }

/* ZFP's decorrelating lifting step on the 4 values p[0], p[s], p[2s], p[3s] */
NX_HD void nx_fwd_lift(nx_i32* p, int s) {
  nx_i32 x = p[0], y = p[s], z = p[2 * s], w = p[3 * s];
  x = nx_add(x, w) >> 1; w = nx_sub(w, x);
  z = nx_add(z, y) >> 1; y = nx_sub(y, z);
  x = nx_add(x, z) >> 1; z = nx_sub(z, x);
  w = nx_add(w, y) >> 1; y = nx_sub(y, w);
  w = nx_add(w, y >> 1); y = nx_sub(y, w >> 1);
  p[0] = x; p[s] = y; p[2 * s] = z; p[3 * s] = w;
}

NX_HD void nx_inv_lift(nx_i32* p, int s) {
  nx_i32 x = p[0], y = p[s], z = p[2 * s], w = p[3 * s];
  y = nx_add(y, w >> 1); w = nx_sub(w, y >> 1);
  y = nx_add(y, w); w = nx_sub(nx_dbl(w), y);
  z = nx_add(z, x); x = nx_sub(nx_dbl(x), z);
  y = nx_add(y, z); z = nx_sub(nx_dbl(z), y);
  w = nx_add(w, x); x = nx_sub(nx_dbl(x), w);
  p[0] = x; p[s] = y; p[2 * s] = z; p[3 * s] = w;
}

/* coefficient i of the sequency order is block position NX_PERM(i) (zfp_torch.PERM) */
NX_HD int nx_perm(int i) {
  const nx_u64 packed = 0xFEBD7AC396825410ull;  /* nibble i = PERM[i] (0,1,4,5,2,8,...) */
  return (int)((packed >> (4 * i)) & 15u);
}

#define NX_NB 0xAAAAAAAAu   /* negabinary mask */
#define NX_WORDS 9          /* 64-bit words of the largest block (rate 32: 512 bits) + 1 */

/* a block's bit stream, LSB first in little-endian 64-bit words (zfp's own order) */
NX_HD void nx_put(nx_u64* w, int pos, nx_u32 v, int n) {
  if (n <= 0) return;
  nx_u64 bits = (nx_u64)v & ((1ull << n) - 1ull);
  int sh = pos & 63;
  w[pos >> 6] |= bits << sh;
  if (sh + n > 64) w[(pos >> 6) + 1] |= bits >> (64 - sh);
}

NX_HD nx_u32 nx_get(const nx_u64* w, int pos, int n) {
  if (n <= 0) return 0;
  int sh = pos & 63;
  nx_u64 v = w[pos >> 6] >> sh;
  if (sh + n > 64) v |= w[(pos >> 6) + 1] << (64 - sh);
  return (nx_u32)(v & ((1ull << n) - 1ull));
}

/* -- ZFP: one block ---------------------------------------------------------------------- */

/* Encode block b of a flat array of `rows` rows of 4 values into its 2*rate bytes. The
 * last block of 1-3 rows repeats rows as zfp pads them (0,0,0,0 / 0,1,1,0 / 0,1,2,0). A
 * block holding NaN/Inf is written as the header bit 1 and exponent 0 (zfp never writes
 * that exponent); an all-zero block as zero bits. */
NX_HD void nx_zfp_encode_block(const void* x, int dt, nx_i64 rows, nx_i64 b, int rate,
                               nx_u8* out) {
  float f[16];
  nx_i64 nr = rows - 4 * b;
  if (nr > 4) nr = 4;
  for (int i = 0; i < 16; i++) {
    int y = i >> 2;
    int ry = y < nr ? y : (y == 3 ? 0 : (nr == 2 ? 1 : 0));
    f[i] = nx_load(x, (4 * b + ry) * 4 + (i & 3), dt);
  }
  nx_u32 amag = 0;
  int bad = 0;
  for (int i = 0; i < 16; i++) {
    nx_u32 a = nx_b(f[i]) & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) bad = 1;
    else if (a > amag) amag = a;
  }
  nx_u64 w[NX_WORDS];
  for (int i = 0; i < NX_WORDS; i++) w[i] = 0;
  int maxbits = 16 * rate;
  if (bad) {
    w[0] = 1;
  } else if (amag > 0) {
    int emax = (int)((amag >> 23) & 0xFFu) - 126;
    if (emax < -126) emax = -126;
    int e2 = 157 - emax;  /* biased exponent of 2^(30 - emax); >= 255 is inf in fp32 */
    float s = nx_f(e2 >= 255 ? 0x7F800000u : (nx_u32)e2 << 23);
    nx_i32 ib[16];
    for (int i = 0; i < 16; i++) {
      float p = f[i] * s;
      ib[i] = (p < 2147483648.0f && p > -2147483648.0f) ? (nx_i32)p : (nx_i32)0x80000000u;
    }
    for (int r = 0; r < 4; r++) nx_fwd_lift(ib + 4 * r, 1);  /* along each row (x) */
    for (int c = 0; c < 4; c++) nx_fwd_lift(ib + c, 4);      /* along each column (y) */
    nx_u32 u[16];
    for (int i = 0; i < 16; i++) u[i] = ((nx_u32)ib[nx_perm(i)] + NX_NB) ^ NX_NB;
    nx_put(w, 0, 1u + 2u * (nx_u32)(emax + 127), 9);
    int pos = 9, bits = maxbits - 9, n = 0;
    /* bit planes from the top: the first n bits verbatim (values already significant),
     * then group tests: "1" and a scan to the next one-bit, or "0" for none left; value
     * 15 is implied when the scan reaches it. Every bit spends budget; the block stops
     * where the budget does. */
    for (int k = 31; k >= 0 && bits > 0; k--) {
      nx_u32 plane = 0;
      for (int i = 0; i < 16; i++) plane |= ((u[i] >> k) & 1u) << i;
      int m = n < bits ? n : bits;
      nx_put(w, pos, plane, m);
      pos += m; bits -= m; plane >>= m;
      while (n < 16 && bits > 0) {
        bits--;
        nx_u32 any = plane != 0;
        nx_put(w, pos++, any, 1);
        if (!any) break;
        while (n < 15 && bits > 0) {
          bits--;
          nx_u32 bit = plane & 1u;
          nx_put(w, pos++, bit, 1);
          if (bit) break;
          plane >>= 1; n++;
        }
        plane >>= 1; n++;
      }
    }
  }
  for (int j = 0; j < 2 * rate; j++) out[j] = (nx_u8)(w[j >> 3] >> ((j & 7) * 8));
}

/* Decode the 2*rate bytes of block b into values b*16 .. b*16+15 of out (those < n4). */
NX_HD void nx_zfp_decode_block(const nx_u8* in, int rate, nx_i64 b, nx_i64 n4, void* out,
                               int dt) {
  nx_u64 w[NX_WORDS];
  for (int i = 0; i < NX_WORDS; i++) w[i] = 0;
  for (int j = 0; j < 2 * rate; j++) w[j >> 3] |= (nx_u64)in[j] << ((j & 7) * 8);
  nx_u32 head = nx_get(w, 0, 9);
  int e = (int)(head >> 1);
  float v[16];
  if (!(head & 1u) || e == 0) {
    float fill = (head & 1u) ? nx_f(0x7FC00000u) : 0.0f;  /* exponent 0: NaN/Inf block */
    for (int i = 0; i < 16; i++) v[i] = fill;
  } else {
    nx_u32 u[16];
    for (int i = 0; i < 16; i++) u[i] = 0;
    int pos = 9, bits = 16 * rate - 9, n = 0;
    for (int k = 31; k >= 0 && bits > 0; k--) {
      int m = n < bits ? n : bits;
      nx_u32 plane = nx_get(w, pos, m);
      pos += m; bits -= m;
      while (n < 16 && bits > 0) {
        bits--;
        if (!nx_get(w, pos++, 1)) break;
        while (n < 15 && bits > 0) {
          bits--;
          if (nx_get(w, pos++, 1)) break;
          n++;
        }
        plane += 1u << n;  /* found, implied (value 15) or cut by the budget: zfp sets it */
        n++;
      }
      for (int i = 0; i < 16; i++) u[i] |= ((plane >> i) & 1u) << k;
    }
    nx_i32 ib[16];
    for (int i = 0; i < 16; i++) ib[nx_perm(i)] = (nx_i32)((u[i] ^ NX_NB) - NX_NB);
    for (int c = 0; c < 4; c++) nx_inv_lift(ib + c, 4);      /* columns, then rows */
    for (int r = 0; r < 4; r++) nx_inv_lift(ib + 4 * r, 1);
    int sexp = e - 127 - 30;  /* 2^(emax - 30) in fp32: subnormal below 2^-126 */
    float s = sexp >= -126 ? nx_f((nx_u32)(sexp + 127) << 23)
              : (sexp >= -149 ? nx_f(1u << (sexp + 149)) : 0.0f);
    for (int i = 0; i < 16; i++) v[i] = (float)ib[i] * s;
  }
  for (int i = 0; i < 16; i++)
    if (b * 16 + i < n4) nx_store(out, b * 16 + i, v[i], dt);
}

/* -- int8 / int4: one quantisation block ------------------------------------------------- */

/* max that propagates NaN as torch's amax does, as the quiet NaN 0x7FC00000 (x86 keeps it
 * through the division below, a GPU would not: the scale of a NaN block is stored as is) */
NX_HD float nx_nanmax(float a, float b) {
  return (a != a || b != b) ? nx_f(0x7FC00000u) : (b > a ? b : a);
}

/* the max over the lanes that share a block: a warp on the GPU, one lane on the host */
NX_HD float nx_lanes_max(float a) {
#ifdef __CUDA_ARCH__
  for (int o = 16; o > 0; o >>= 1) a = nx_nanmax(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
#endif
  return a;
}

NX_HD float nx_quant_code(float v, float inv) {
  float q = v * inv;
  q = (q + 12582912.0f) - 12582912.0f;  /* round half to even (|q| <= qmax < 2^22) */
  return q != q ? 0.0f : q;             /* inf * 0 in a non-finite block */
}

/* Scale = max|x| / qmax and codes round(x * (1 / max|x|) * qmax) of block blk; lane of
 * nl lanes takes every nl-th value (int4: every nl-th pair, low nibble first). */
NX_HD void nx_quant_encode_block(const void* x, int dt, nx_i64 n, nx_i64 blk, int block,
                                 int qmax, int nbits, float* scales, nx_u8* codes, int lane,
                                 int nl) {
  nx_i64 start = blk * block, end = start + block < n ? start + block : n;
  float a = 0.0f;
  for (nx_i64 i = start + lane; i < end; i += nl)
    a = nx_nanmax(a, nx_f(nx_b(nx_load(x, i, dt)) & 0x7FFFFFFFu));
  a = nx_lanes_max(a);
  if (lane == 0) scales[blk] = a != a ? a : a / (float)qmax;
  float inv = (1.0f / a) * (float)qmax;  /* torch computes qmax / t as qmax * (1 / t) */
  if (inv != inv || inv > 3.402823466e38f) inv = 0.0f;
  if (nbits == 8) {
    for (nx_i64 i = start + lane; i < end; i += nl)
      codes[i] = (nx_u8)(signed char)(int)nx_quant_code(nx_load(x, i, dt), inv);
  } else {
    for (nx_i64 p = start / 2 + lane; 2 * p < end; p += nl) {
      int lo = (int)nx_quant_code(nx_load(x, 2 * p, dt), inv) + 8;
      int hi = 2 * p + 1 < end ? (int)nx_quant_code(nx_load(x, 2 * p + 1, dt), inv) + 8 : 0;
      codes[p] = (nx_u8)(lo | (hi << 4));
    }
  }
}

NX_HD float nx_quant_value(const float* scales, const nx_u8* codes, nx_i64 i, int block,
                           int nbits) {
  float q = nbits == 8 ? (float)(signed char)codes[i]
                       : (float)((int)((codes[i >> 1] >> ((i & 1) * 4)) & 15u) - 8);
  return q * scales[i / block];
}

/* -- the GPU kernels (NVRTC) ------------------------------------------------------------- */
#if defined(__CUDACC__)

extern "C" __global__ void nx_zfp_encode(const void* x, nx_u8* out, nx_i64 rows,
                                         nx_i64 nblocks, int rate, int dt) {
  nx_i64 b = (nx_i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (b < nblocks) nx_zfp_encode_block(x, dt, rows, b, rate, out + b * 2 * rate);
}

extern "C" __global__ void nx_zfp_decode(const nx_u8* in, void* out, nx_i64 n4,
                                         nx_i64 nblocks, int rate, int dt) {
  nx_i64 b = (nx_i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (b < nblocks) nx_zfp_decode_block(in + b * 2 * rate, rate, b, n4, out, dt);
}

/* one warp per quantisation block (blockDim.x a multiple of 32) */
extern "C" __global__ void nx_quant_encode(const void* x, float* scales, nx_u8* codes,
                                           nx_i64 n, int block, int qmax, int nbits, int dt) {
  nx_i64 blk = ((nx_i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (blk < (n + block - 1) / block)  /* the same for the whole warp */
    nx_quant_encode_block(x, dt, n, blk, block, qmax, nbits, scales, codes,
                          (int)(threadIdx.x & 31u), 32);
}

extern "C" __global__ void nx_quant_decode(const float* scales, const nx_u8* codes,
                                           void* out, nx_i64 n, int block, int nbits, int dt) {
  nx_i64 i = (nx_i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) nx_store(out, i, nx_quant_value(scales, codes, i, block, nbits), dt);
}

#else /* -- the host build (g++ -shared), for the tests ---------------------------------- */

extern "C" void nx_host_zfp_encode(const void* x, nx_u8* out, nx_i64 rows, nx_i64 nblocks,
                                   int rate, int dt) {
  for (nx_i64 b = 0; b < nblocks; b++) nx_zfp_encode_block(x, dt, rows, b, rate, out + b * 2 * rate);
}

extern "C" void nx_host_zfp_decode(const nx_u8* in, void* out, nx_i64 n4, nx_i64 nblocks,
                                   int rate, int dt) {
  for (nx_i64 b = 0; b < nblocks; b++) nx_zfp_decode_block(in + b * 2 * rate, rate, b, n4, out, dt);
}

extern "C" void nx_host_quant_encode(const void* x, float* scales, nx_u8* codes, nx_i64 n,
                                     int block, int qmax, int nbits, int dt) {
  for (nx_i64 blk = 0; blk < (n + block - 1) / block; blk++)
    nx_quant_encode_block(x, dt, n, blk, block, qmax, nbits, scales, codes, 0, 1);
}

extern "C" void nx_host_quant_decode(const float* scales, const nx_u8* codes, void* out,
                                     nx_i64 n, int block, int nbits, int dt) {
  for (nx_i64 i = 0; i < n; i++) nx_store(out, i, nx_quant_value(scales, codes, i, block, nbits), dt);
}

#endif
