// Fixed-width integer names, the TMA descriptor type and the inline attribute.
// NVRTC ships no <cstdint> by default, so the device code names its own types.
#pragma once

namespace deepgemm {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
using i32 = int;
using i64 = long long;

// The 128-byte opaque CUtensorMap, filled on the host by cuTensorMapEncodeTiled and passed by value
// as a __grid_constant__ kernel parameter.
struct alignas(64) TmaDescriptor {
    u64 opaque[16];
};

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
    return (a + b - 1) / b;
}

template <typename T>
__host__ __device__ constexpr T gcd(T a, T b) {
    return b == 0 ? a : gcd(b, a % b);
}

template <typename T>
__host__ __device__ constexpr T align_up(T a, T b) {
    return ceil_div(a, b) * b;
}

}  // namespace deepgemm

#define DG_DEVICE __device__ __forceinline__
