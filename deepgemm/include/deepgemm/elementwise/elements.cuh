// Element access shared by the element-wise kernel families (quantizers, softmax, RoPE): float32, bfloat16 or
// float16 values loaded as float32, one at a time or eight / four from a 16-byte vector, and stored back rounded to
// nearest-even; a NaN-propagating max.
#pragma once
#include <deepgemm/ptx/types.cuh>

namespace deepgemm {

enum class InputKind : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

template <InputKind kKind>
inline constexpr u32 kElementBytes = kKind == InputKind::kFloat32 ? 4 : 2;

// Elements in one 16-byte vector.
template <InputKind kKind>
inline constexpr u32 kVectorElements = 16 / kElementBytes<kKind>;

template <InputKind kKind>
DG_DEVICE float load_as_float(const void* base, u64 index) {
    if constexpr (kKind == InputKind::kFloat32) {
        return static_cast<const float*>(base)[index];
    } else if constexpr (kKind == InputKind::kBFloat16) {
        const u32 bits = static_cast<const u16*>(base)[index];
        return __uint_as_float(bits << 16);
    } else {
        const u16 bits = static_cast<const u16*>(base)[index];
        float value;
        asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
        return value;
    }
}

// One float rounded to the element type (nearest-even; NaN stays NaN), as its bits in the low 16 (or 32) bits.
template <InputKind kKind>
DG_DEVICE u32 float_to_bits(float value) {
    if constexpr (kKind == InputKind::kFloat32) {
        return __float_as_uint(value);
    } else if constexpr (kKind == InputKind::kBFloat16) {
        u16 bits;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));
        return bits;
    } else {
        u16 bits;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
        return bits;
    }
}

template <InputKind kKind>
DG_DEVICE void store_from_float(void* base, u64 index, float value) {
    if constexpr (kKind == InputKind::kFloat32) {
        static_cast<float*>(base)[index] = value;
    } else {
        static_cast<u16*>(base)[index] = static_cast<u16>(float_to_bits<kKind>(value));
    }
}

// -inf and a quiet NaN (NVRTC has no <cmath> macros).
DG_DEVICE float negative_infinity() { return __uint_as_float(0xFF800000u); }
DG_DEVICE float quiet_nan() { return __uint_as_float(0x7FFFFFFFu); }

// max that propagates NaN (fmaxf would drop it), as torch's amax / max do.
DG_DEVICE float max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Eight (bf16/fp16) or four (fp32) values of one 16-byte vector, as floats.
template <InputKind kKind>
DG_DEVICE void unpack_vector(const uint4& raw, float* out) {
    const u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        if constexpr (kKind == InputKind::kFloat32) {
            out[i] = __uint_as_float(words[i]);
        } else if constexpr (kKind == InputKind::kBFloat16) {
            out[2 * i] = __uint_as_float(words[i] << 16);
            out[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
        } else {
            const u16 lo = static_cast<u16>(words[i] & 0xFFFFu), hi = static_cast<u16>(words[i] >> 16);
            asm("cvt.f32.f16 %0, %1;" : "=f"(out[2 * i]) : "h"(lo));
            asm("cvt.f32.f16 %0, %1;" : "=f"(out[2 * i + 1]) : "h"(hi));
        }
    }
}

// The inverse of unpack_vector: kVectorElements floats rounded into one 16-byte vector.
template <InputKind kKind>
DG_DEVICE uint4 pack_vector(const float* values) {
    u32 words[4];
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        if constexpr (kKind == InputKind::kFloat32) {
            words[i] = __float_as_uint(values[i]);
        } else {
            words[i] = float_to_bits<kKind>(values[2 * i]) | (float_to_bits<kKind>(values[2 * i + 1]) << 16);
        }
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
}

template <InputKind kKind>
DG_DEVICE void load_vector_as_float(const void* address, float* out) {
    unpack_vector<kKind>(*static_cast<const uint4*>(address), out);
}

}  // namespace deepgemm
