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

RespValue ValueOf(const redisReply& r) {
  switch (r.type) {
    case REDIS_REPLY_STRING:
      return RespValue::String(std::string(r.str, r.len));
    case REDIS_REPLY_STATUS:
      return RespValue::Status(std::string(r.str, r.len));
    case REDIS_REPLY_ERROR:
      return RespValue::Error(std::string(r.str, r.len));
    case REDIS_REPLY_INTEGER:
      return RespValue::Integer(r.integer);
    case REDIS_REPLY_ARRAY: {
      std::vector<RespValue> elements;
      elements.reserve(r.elements);
      for (size_t i = 0; i < r.elements; ++i) elements.push_back(ValueOf(*r.element[i]));
      return RespValue::Array(std::move(elements));
    }
    default:
      return RespValue::Nil();
  }
}

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
    auto* reply = static_cast<redisReply*>(raw);
    replies.push_back(ValueOf(*reply));
    freeReplyObject(reply);
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
