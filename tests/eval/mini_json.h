// kvcache-eval: a minimal JSON reader, enough for a safetensors header.
//
// Parses one JSON document (RFC 8259) into a JsonValue tree: objects keep
// their members in document order and reject duplicate keys; strings are
// decoded (escapes including \uXXXX surrogate pairs, to UTF-8); numbers are
// kept as double, and a literal that is a non-negative integer below 2^64
// also as an exact uint64_t (safetensors shapes and offsets need all 64
// bits). Nesting deeper than `max_depth` is refused, so hostile input cannot
// exhaust the stack. Errors are INVALID_ARGUMENT with the byte offset.
//
// Thread-safety: pure functions; a JsonValue is a plain value.
#ifndef KVCACHE_TESTS_EVAL_MINI_JSON_H_
#define KVCACHE_TESTS_EVAL_MINI_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvcache::eval {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  bool is_uint = false;  // the number literal is an integer in [0, 2^64)
  uint64_t uint_value = 0;
  std::string string;
  std::vector<JsonValue> array;
  // An object's members. A struct rather than std::pair: libstdc++ refuses a
  // pair of an incomplete type under clang.
  struct Member;
  std::vector<Member> object;

  // The member named `key` of an object; nullptr when absent or not an object.
  const JsonValue* Find(std::string_view key) const;
};

struct JsonValue::Member {
  std::string key;
  JsonValue value;
};

// "null", "bool", "number", "string", "array", "object".
const char* JsonKindName(JsonValue::Kind kind);

absl::StatusOr<JsonValue> ParseJson(std::string_view text, int max_depth = 32);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_MINI_JSON_H_
