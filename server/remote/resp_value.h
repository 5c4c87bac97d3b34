// RespValue: one reply of a Redis server (RESP2), as plain data, so that the
// code reading replies (the cluster's slot map, redirects) does not depend on
// the client library that received them.
#ifndef KVCACHE_SERVER_REMOTE_RESP_VALUE_H_
#define KVCACHE_SERVER_REMOTE_RESP_VALUE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache {

struct RespValue {
  enum class Type : uint8_t { kNil, kString, kStatus, kError, kInteger, kArray };

  static RespValue Nil() { return {}; }
  static RespValue String(std::string s) { return {Type::kString, std::move(s), 0, {}}; }
  static RespValue Status(std::string s) { return {Type::kStatus, std::move(s), 0, {}}; }
  static RespValue Error(std::string s) { return {Type::kError, std::move(s), 0, {}}; }
  static RespValue Integer(int64_t i) { return {Type::kInteger, {}, i, {}}; }
  static RespValue Array(std::vector<RespValue> e) { return {Type::kArray, {}, 0, std::move(e)}; }

  bool is_error() const { return type == Type::kError; }
  bool is_nil() const { return type == Type::kNil; }

  Type type = Type::kNil;
  std::string str;  // kString (bulk), kStatus, kError
  int64_t integer = 0;
  std::vector<RespValue> elements;  // kArray
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_RESP_VALUE_H_
