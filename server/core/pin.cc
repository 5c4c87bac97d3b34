#include "server/core/pin.h"

namespace kvcache {

std::string_view PinReasonName(PinReason reason) {
  switch (reason) {
    case PinReason::kLease:
      return "lease";
    case PinReason::kFetch:
      return "fetch";
    case PinReason::kAppend:
      return "append";
    case PinReason::kMove:
      return "move";
    case PinReason::kCheckpoint:
      return "checkpoint";
    case PinReason::kInspect:
      return "inspect";
  }
  return "unknown";
}

}  // namespace kvcache
