// kvcache/gpu/status.h: the error vocabulary of kvcache::gpu.
//
// The GPU tier's device layer builds without Abseil, so errors are a small value type instead of
// absl::Status. GpuCode values are the absl::StatusCode (= gRPC) numbers, so the daemon converts
// with one cast: absl::Status(static_cast<absl::StatusCode>(s.code), s.message). Nothing in this
// library throws; every fallible call returns a GpuStatus whose message names the argument,
// limit or CUDA error (with the CUDA error string) that failed.
#ifndef KVCACHE_GPU_STATUS_H_
#define KVCACHE_GPU_STATUS_H_

#include <cstdint>
#include <string>
#include <utility>

namespace kvcache::gpu {

enum class GpuCode : int32_t {
  kOk = 0,
  kInvalidArgument = 3,     // a size, pointer, handle or option broke a contract; nothing done
  kNotFound = 5,            // unknown arena, stream, mapping or block
  kResourceExhausted = 8,   // the tier (or the device) is full
  kFailedPrecondition = 9,  // the object is not usable (e.g. no device)
  kInternal = 13,           // a CUDA runtime call or an OS call failed
  kUnavailable = 14,        // no usable device (Probe() says why)
  kDataLoss = 15,           // bytes read back do not match their checksum
};

// Stable lower-case name ("ok", "invalid_argument", ...).
const char* GpuCodeName(GpuCode code);

struct [[nodiscard]] GpuStatus {
  GpuCode code = GpuCode::kOk;
  std::string message;

  bool ok() const { return code == GpuCode::kOk; }
  // "ok" or "<code name>: <message>".
  std::string ToString() const;

  static GpuStatus Ok() { return {}; }
  static GpuStatus Error(GpuCode code, std::string message) { return {code, std::move(message)}; }
};

}  // namespace kvcache::gpu

#endif  // KVCACHE_GPU_STATUS_H_
