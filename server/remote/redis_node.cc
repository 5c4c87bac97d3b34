#include "server/remote/redis_node.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

timeval TimevalOf(absl::Duration d) {
  const int64_t us = absl::ToInt64Microseconds(d);
  return timeval{.tv_sec = static_cast<time_t>(us / 1000000),
                 .tv_usec = static_cast<suseconds_t>(us % 1000000)};
}

// hiredis's reader builds RespValues itself (no redisReply in between), so a
// value's bytes are copied once, from the read buffer into its string. A
// reply's top-level value is allocated here and freed by the caller (or by
// FreeValue when hiredis drops it); each element lives in its array, sized
// when the array's header is read.
void* Place(const redisReadTask* task, RespValue value) {
  if (task->parent != nullptr) {
    RespValue& slot = static_cast<RespValue*>(task->parent->obj)->elements[task->idx];
    slot = std::move(value);
    return &slot;
  }
  return new RespValue(std::move(value));
}
void* CreateString(const redisReadTask* task, char* str, size_t len) {
  std::string text(str, len);
  switch (task->type) {
    case REDIS_REPLY_ERROR:
      return Place(task, RespValue::Error(std::move(text)));
    case REDIS_REPLY_STATUS:
      return Place(task, RespValue::Status(std::move(text)));
    default:
      return Place(task, RespValue::String(std::move(text)));
  }
}
void* CreateArray(const redisReadTask* task, int elements) {
  return Place(task, RespValue::Array(std::vector<RespValue>(static_cast<size_t>(elements))));
}
void* CreateInteger(const redisReadTask* task, long long value) {  // NOLINT: hiredis's type
  return Place(task, RespValue::Integer(value));
}
void* CreateNil(const redisReadTask* task) { return Place(task, RespValue::Nil()); }
void FreeValue(void* value) { delete static_cast<RespValue*>(value); }

redisReplyObjectFunctions kRespValueFunctions = {CreateString, CreateArray, CreateInteger,
                                                 CreateNil, FreeValue};

}  // namespace

absl::StatusOr<std::unique_ptr<RedisNode>> RedisNode::Connect(const NodeAddress& address,
                                                              const RedisNodeOptions& options) {
  redisContext* context = redisConnectWithTimeout(address.host.c_str(), address.port,
                                                  TimevalOf(options.connect_timeout));
  if (context == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("redis ", address.ToString(), ": cannot allocate a connection"));
  }
  if (context->err != 0) {
    absl::Status status = absl::UnavailableError(
        absl::StrCat("redis ", address.ToString(), ": cannot connect: ", context->errstr));
    redisFree(context);
    return status;
  }
  context->reader->fn = &kRespValueFunctions;
  // Keep the read buffer between replies: values of hundreds of KiB would
  // otherwise grow a fresh one, page by page, for each.
  context->reader->maxbuf = 0;
  if (redisSetTimeout(context, TimevalOf(options.io_timeout)) != REDIS_OK) {
    redisFree(context);
    return absl::UnavailableError(
        absl::StrCat("redis ", address.ToString(), ": cannot set the socket timeout"));
  }
  std::unique_ptr<RedisNode> node(new RedisNode(address, context));
  if (!options.password.empty()) {
    RedisCommand auth = {"AUTH"};
    if (!options.user.empty()) auth.push_back(options.user);
    auth.push_back(options.password);
    absl::StatusOr<RespValue> reply = node->Run(auth);
    if (!reply.ok()) return reply.status();
    if (reply->is_error()) {
      return absl::PermissionDeniedError(
          absl::StrCat("redis ", address.ToString(), ": AUTH refused: ", reply->str));
    }
  }
  return node;
}

RedisNode::RedisNode(NodeAddress address, redisContext* context)
    : address_(std::move(address)), context_(context) {}

RedisNode::~RedisNode() { redisFree(context_); }

absl::Status RedisNode::Broke(const char* doing) {
  broken_ = true;
  return absl::UnavailableError(
      absl::StrCat("redis ", address_.ToString(), ": ", doing, ": ",
                   context_->errstr[0] != '\0' ? context_->errstr : "connection lost"));
}

absl::StatusOr<std::vector<RespValue>> RedisNode::Pipeline(std::span<const RedisCommand> commands) {
  if (broken_) {
    return absl::UnavailableError(
        absl::StrCat("redis ", address_.ToString(), ": the connection failed before"));
  }
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const RedisCommand& command : commands) {
    argv.clear();
    lengths.clear();
    for (const std::string& word : command) {
      argv.push_back(word.data());
      lengths.push_back(word.size());
    }
    if (redisAppendCommandArgv(context_, static_cast<int>(argv.size()), argv.data(),
                               lengths.data()) != REDIS_OK) {
      return Broke("cannot queue a command");
    }
  }
  std::vector<RespValue> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) {
      return Broke("no reply");
    }
    std::unique_ptr<RespValue> reply(static_cast<RespValue*>(raw));
    replies.push_back(std::move(*reply));
  }
  return replies;
}

absl::StatusOr<RespValue> RedisNode::Run(const RedisCommand& command) {
  absl::StatusOr<std::vector<RespValue>> replies =
      Pipeline(std::span<const RedisCommand>(&command, 1));
  if (!replies.ok()) return replies.status();
  return std::move(replies->front());
}

}  // namespace kvcache
