// AMX tile instructions as inline assembly (the AVX-512 copy only; callers check cpu_has_amx_bf16()). As
// assembly rather than GCC's intrinsics, whose target("amx-tile") functions could not inline into the copy's
// loops; tile numbers are template arguments because the instructions encode them.
//
// One configuration serves every product of decode_amx_kernel.h: 8 tiles of 16 rows x 64 bytes (A: 16 x 32
// bfloat16, B: 16 pairs of rows x 16 columns x 2 in VNNI order, C: 16 x 16 float32).
#pragma once

#include "common/cpu_isa.h"

#include <cstdint>

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)

namespace attn_ops::cpu {
inline namespace CPU_CAPABILITY {

constexpr int64_t kAmxRows = 16;        // rows of every tile
constexpr int64_t kAmxK = 32;           // bfloat16 values per A row (the depth of one tile product)
constexpr int64_t kAmxRowBytes = 64;    // bytes per tile row

// Loads the configuration above into this thread's tile registers.
inline void amx_configure() {
  alignas(64) uint8_t config[64] = {};
  config[0] = 1;  // palette 1
  for (int t = 0; t < 8; ++t) {
    config[16 + 2 * t] = kAmxRowBytes;  // colsb[t] (little-endian uint16)
    config[48 + t] = kAmxRows;          // rows[t]
  }
  asm volatile("ldtilecfg %0" ::"m"(*reinterpret_cast<const uint8_t(*)[64]>(config)));
}

// Frees the tile state (the OS then saves no tile data at context switches).
inline void amx_release() { asm volatile("tilerelease" ::: "memory"); }

template <int T>
inline void tile_zero() {
  asm volatile("tilezero %%tmm%c0" ::"i"(T));
}

// Tile T = the 16 rows of 64 bytes at base, `stride` bytes apart.
template <int T>
inline void tile_load(const void* base, int64_t stride) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(T) : "memory");
}

template <int T>
inline void tile_store(void* base, int64_t stride) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(T) : "memory");
}

// Tile C += tile A (16 x 32 bfloat16) x tile B (VNNI, 32 x 16), in float32.
template <int C, int A, int B>
inline void tile_dot_bf16() {
  asm volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(B), "i"(A), "i"(C));
}

}  // namespace CPU_CAPABILITY
}  // namespace attn_ops::cpu

#endif
