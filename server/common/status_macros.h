// Status propagation in one line, for functions returning absl::Status or
// absl::StatusOr<T>:
//
//   KVCACHE_RETURN_IF_ERROR(file.Sync());          // returns the error, if any
//   KVCACHE_ASSIGN_OR_RETURN(UniqueFd fd, Open(path));  // fd = the value, or return
//
// The argument is evaluated exactly once. KVCACHE_ASSIGN_OR_RETURN declares
// a hidden StatusOr in the enclosing scope, so it is a statement of its own
// (not the body of an unbraced if). Abseil keeps its own versions of these
// internal; the names here are the project's.
#ifndef KVCACHE_SERVER_COMMON_STATUS_MACROS_H_
#define KVCACHE_SERVER_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVCACHE_RETURN_IF_ERROR(expr)                                     \
  do {                                                                    \
    if (::absl::Status kvcache_status_ = (expr); !kvcache_status_.ok()) { \
      return kvcache_status_;                                             \
    }                                                                     \
  } while (false)

#define KVCACHE_ASSIGN_OR_RETURN(lhs, expr)                                                       \
  KVCACHE_ASSIGN_OR_RETURN_IMPL_(KVCACHE_STATUS_MACROS_CONCAT_(kvcache_statusor_, __LINE__), lhs, \
                                 expr)

#define KVCACHE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = *std::move(statusor)

#define KVCACHE_STATUS_MACROS_CONCAT_(a, b) KVCACHE_STATUS_MACROS_CONCAT_INNER_(a, b)
#define KVCACHE_STATUS_MACROS_CONCAT_INNER_(a, b) a##b

#endif  // KVCACHE_SERVER_COMMON_STATUS_MACROS_H_
