// kvcache/kernels/types.h: the vocabulary shared by every kernel in kvcache::kernels.
//
// The kernel library is the numeric core of importance-aware precision: INT8 quantization of KV
// blocks, key novelty, importance scoring, token compaction and a reference attention used to
// measure what compression costs. Every kernel exists twice ("kernels have twins"): a CPU
// reference `FooCpu(...)` that always builds, and a CUDA version `FooCuda(..., cudaStream_t)`
// (declared in cuda_kernels.h) with the same arguments, the same contract and a stated parity
// tolerance.
//
// Conventions for every kernel in this library:
//   * Host API only: plain pointers and sizes, no STL, no ownership transfer. The caller owns
//     every buffer; kernels never allocate caller-visible memory and never keep pointers.
//   * Errors are values: every kernel returns KernelStatus. kInvalidArgument means nothing was
//     written. Preconditions a kernel cannot check cheaply are listed as REQUIRES.
//   * Sizes are int64_t element counts; each dimension must be in [0, kMaxDimension]. A call
//     with an empty shape (any dimension 0) is a no-op returning kOk.
//   * A "KV slice" is num_heads independent [num_tokens][head_dim] row-major matrices stored
//     back to back: element (h, t, d) lives at index (h * num_tokens + t) * head_dim + d.
//   * Thread-safety: kernels are pure functions of their arguments; concurrent calls are safe
//     as long as their output buffers do not overlap any other call's buffers.
//   * Non-finite inputs (NaN, Inf) produce unspecified values but never undefined behaviour or
//     out-of-bounds access.
//   * The CPU kernels assume the default floating-point environment (round to nearest even,
//     no flush-to-zero / denormals-are-zero); results are stated for that environment.
#ifndef KVCACHE_KERNELS_TYPES_H_
#define KVCACHE_KERNELS_TYPES_H_

#include <cstddef>
#include <cstdint>

namespace kvcache::kernels {

// Element type of a KV buffer. 16-bit types are stored as raw IEEE-754 binary16 / bfloat16
// bit patterns (uint16_t), so the host API needs no half-precision C++ type.
enum class DType : int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kInt8 = 3,  // Only where a kernel says so (gather of quantized data).
};

// Size in bytes of one element of `dtype`; 0 for an unknown value.
size_t DTypeSize(DType dtype);
// Stable lower-case name ("f32", "f16", "bf16", "i8"); "unknown" for an unknown value.
const char* DTypeName(DType dtype);

enum class KernelStatus : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // A size, pointer or parameter broke the contract; nothing written.
  kDeviceError = 2,      // CUDA only: the launch or a runtime call failed.
};

// Stable name of a status ("ok", "invalid_argument", "device_error").
const char* KernelStatusName(KernelStatus status);

// Largest accepted value of any single dimension (token indices are int32_t).
inline constexpr int64_t kMaxDimension = (int64_t{1} << 31) - 1;

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_TYPES_H_
