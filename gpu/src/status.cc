#include "kvcache/gpu/status.h"

namespace kvcache::gpu {

const char* GpuCodeName(GpuCode code) {
  switch (code) {
    case GpuCode::kOk:
      return "ok";
    case GpuCode::kInvalidArgument:
      return "invalid_argument";
    case GpuCode::kNotFound:
      return "not_found";
    case GpuCode::kResourceExhausted:
      return "resource_exhausted";
    case GpuCode::kFailedPrecondition:
      return "failed_precondition";
    case GpuCode::kInternal:
      return "internal";
    case GpuCode::kUnavailable:
      return "unavailable";
    case GpuCode::kDataLoss:
      return "data_loss";
  }
  return "unknown";
}

std::string GpuStatus::ToString() const {
  if (ok()) return "ok";
  return std::string(GpuCodeName(code)) + ": " + message;
}

}  // namespace kvcache::gpu
