// CacheService::Fetch (cache_service.h): the FetchReactor, which plans the
// fetch (its lower-tier reads on the cache's fetch-read threads) and streams
// each block as FetchResponse chunks whose data slices point into pool memory
// (EncodeChunk), pinning only the blocks not yet handed to gRPC.
#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/mutex.h"
#include "server/core/fetch_block.h"
#include "server/frontdoor/call_scope.h"
#include "server/frontdoor/proto_convert.h"
#include "server/rpc/cache_service.h"
#include "server/rpc/grpc_call.h"
#include "server/rpc/status_convert.h"
#include "server/rpc/stream_lifecycle.h"

namespace kvcache {

namespace {

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// Encodes a FetchResponse whose `data` is `size` bytes of `block` at
// `offset`, without copying them: the data slice holds a pinned reference
// to the block (pin.h: the cache does not evict what gRPC is still sending)
// and points into its memory. `kept` goes out only on a first chunk.
grpc::ByteBuffer EncodeChunk(uint64_t matched_tokens, uint64_t withheld_tokens,
                             uint32_t block_index, const PinnedBlock& block, uint64_t offset,
                             uint64_t size, v1::BlockEncoding encoding,
                             const std::vector<uint32_t>& kept) {
  const bool with_kept = offset == 0 && !kept.empty();
  // At most 8 tags + 8 ten-byte varints, plus the kept list: no heap
  // allocation for an ordinary chunk.
  absl::InlinedVector<uint8_t, 96> head(96 + (with_kept ? 10 + 5 * kept.size() : 0));
  uint8_t* p = head.data();
  *p++ = 0x08;  // matched_tokens = 1, varint
  p = PutVarint(p, matched_tokens);
  *p++ = 0x10;  // block_index = 2
  p = PutVarint(p, block_index);
  *p++ = 0x18;  // block_bytes = 3
  p = PutVarint(p, block->size());
  *p++ = 0x20;  // block_checksum = 4
  p = PutVarint(p, block->checksum());
  *p++ = 0x28;  // offset = 5
  p = PutVarint(p, offset);
  if (encoding != v1::BLOCK_ENCODING_RAW) {
    *p++ = 0x30;  // encoding = 6, varint
    p = PutVarint(p, static_cast<uint64_t>(encoding));
  }
  if (with_kept) {
    uint64_t packed = 0;
    for (uint32_t t : kept) packed += VarintSize(t);
    *p++ = 0x3A;  // kept_tokens = 7, packed
    p = PutVarint(p, packed);
    for (uint32_t t : kept) p = PutVarint(p, t);
  }
  if (withheld_tokens != 0) {
    *p++ = 0x40;  // withheld_tokens = 8, varint
    p = PutVarint(p, withheld_tokens);
  }
  *p++ = 0x7A;  // data = 15, length-delimited
  p = PutVarint(p, size);
  grpc::Slice slices[2] = {
      grpc::Slice(head.data(), static_cast<size_t>(p - head.data())),
      grpc::Slice(
          const_cast<std::byte*>(block->data().data()) + offset, size,
          [](void* ref) { delete static_cast<PinnedBlock*>(ref); }, new PinnedBlock(block))};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace

class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(CacheService* service, grpc::CallbackServerContext* ctx,
               const grpc::ByteBuffer* raw_request)
      : service_(service),
        ctx_(ctx),
        lifecycle_(service, ctx, "Fetch", "a write did not complete"),
        request_id_(RequestIdOf(*ctx)) {
    ctx_->AddTrailingMetadata(kRequestIdHeader, request_id_);
    if (absl::Status s = lifecycle_.Begin([this] { ReleasePlan(); }); !s.ok()) {
      Done(s);
      return;
    }
    if (service_->options_.inflight != nullptr) {
      inflight_ = service_->options_.inflight->Register("Fetch", request_id_, lifecycle_.peer());
    }
    // The request is gRPC's only until this returns: parse it now.
    absl::StatusOr<v1::FetchRequest> request = Parse(raw_request);
    if (!request.ok()) {
      Done(request.status());
      return;
    }
    lifecycle_.RunStep([this, request = *std::move(request)](absl::Status admitted) {
      if (!admitted.ok()) return Done(admitted);
      Prepare(request);
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Done(lifecycle_.BrokeOff(absl::CancelledError("fetch stream broke off")));
    lifecycle_.Progress();
    lifecycle_.RunStep([this](absl::Status admitted) {
      if (!admitted.ok()) return Done(admitted);
      WriteNext();
    });
  }

  void OnDone() override {
    lifecycle_.End();
    if (finished_with_write_ && ctx_->IsCancelled()) {
      status_ = lifecycle_.BrokeOff(absl::CancelledError("fetch stream broke off"));
    }
    inflight_.Reset();
    ReportCallDone(service_->observer_, {.method = "Fetch",
                                         .request_id = request_id_,
                                         .peer = lifecycle_.peer(),
                                         .model = model_,
                                         .status = status_,
                                         .latency = absl::Now() - start_,
                                         .bytes = bytes_});
    delete this;
  }

 private:
  static absl::StatusOr<v1::FetchRequest> Parse(const grpc::ByteBuffer* raw_request) {
    v1::FetchRequest request;
    grpc::ByteBuffer copy(*raw_request);  // shares the slices
    grpc::Status parsed = grpc::SerializationTraits<v1::FetchRequest>::Deserialize(&copy, &request);
    if (!parsed.ok()) return absl::InvalidArgumentError("FetchRequest does not parse");
    return request;
  }

  // Checks the request and plans the fetch. The plan is made on the cache's
  // fetch-read threads when blocks must be read back from the SSD tier, so
  // this step never waits on the disk: the stream goes on from OnPlanned.
  void Prepare(const v1::FetchRequest& request) {
    model_ = ModelField({request.namespace_(), request.model_id()});
    auto key = ScopedModelKey(lifecycle_.caller(), request.namespace_(), request.model_id());
    if (!key.ok()) return Done(key.status());
    chunk_bytes_ = service_->options_.fetch_chunk_bytes;
    if (request.max_chunk_bytes() != 0) {
      if (request.max_chunk_bytes() < 4096) {
        return Done(absl::InvalidArgumentError(
            absl::StrCat("max_chunk_bytes is ", request.max_chunk_bytes(),
                         "; it must be 0 (default) or >= 4096")));
      }
      chunk_bytes_ = std::min<uint64_t>(chunk_bytes_, request.max_chunk_bytes());
    }
    // Lossy KV only to a worker that opted in.
    if (request.lossy_as_stored() && !request.accept_lossy()) {
      return Done(absl::InvalidArgumentError(
          "lossy_as_stored needs accept_lossy: lossy blocks are sent only to a worker that opts "
          "in"));
    }
    if (request.lease_id() != 0 && !request.tokens().empty()) {
      return Done(absl::InvalidArgumentError("set either tokens or lease_id, not both"));
    }
    lossy_as_stored_ = request.lossy_as_stored();
    const FetchQuery query{.tokens = TokensOf(request.tokens()),
                           .lease_id = request.lease_id(),
                           .accept_lossy = request.accept_lossy()};
    const std::thread::id step_thread = std::this_thread::get_id();
    service_->cache_->PrepareFetchAsync(*key, query, [this, step_thread](auto plan) {
      OnPlanned(std::move(plan), /*in_step=*/std::this_thread::get_id() == step_thread);
    });
  }

  // The plan is made: streams it, at once when still in the step that asked
  // for it, else (the reads ran on a fetch-read thread) from a step of its
  // own, admitted by the fair scheduler as every step of the stream is.
  void OnPlanned(absl::StatusOr<FetchPlan> plan, bool in_step) ABSL_LOCKS_EXCLUDED(plan_mu_) {
    if (!plan.ok()) return Done(plan.status());
    if (plan->withheld_tokens != 0) {
      ctx_->AddTrailingMetadata("kvcache-withheld-tokens", absl::StrCat(plan->withheld_tokens));
    }
    {
      MutexLock lock(&plan_mu_);
      // Cancelled while the reads ran: keep nothing pinned (EncodeNext ends it).
      if (!plan_released_) plan_ = *std::move(plan);
    }
    if (in_step) return WriteNext();
    lifecycle_.RunStep([this](absl::Status admitted) {
      if (!admitted.ok()) return Done(admitted);
      WriteNext();
    });
  }

  // On the watchdog thread, as an idle stream is cancelled: drops the blocks
  // not yet handed to gRPC at once. The pending write fails only when the
  // transport gives up on the peer, which for a peer that stopped reading
  // can be as late as keepalive notices.
  void ReleasePlan() ABSL_LOCKS_EXCLUDED(plan_mu_) {
    MutexLock lock(&plan_mu_);
    plan_released_ = true;
    plan_.blocks = {};
    current_ = FetchBlock();
  }

  // Sends the next chunk, or finishes. It starts the write (or Finish) only
  // after letting go of plan_mu_: on a kv-fair thread, outside any
  // reaction, the next reaction (and OnDone, which deletes the reactor) may
  // run as soon as the write is started.
  void WriteNext() ABSL_LOCKS_EXCLUDED(plan_mu_) {
    absl::Status end;
    const Next next = EncodeNext(&end);
    if (next == Next::kEnd) return Done(end);
    if (next == Next::kWrite) return StartWrite(&buffer_);
    // The last chunk goes out with the status in one batch (one write, no
    // further reaction); the slot is free once it is handed to gRPC.
    status_ = absl::OkStatus();
    finished_with_write_ = true;
    lifecycle_.ReleaseSlot();
    StartWriteAndFinish(&buffer_, grpc::WriteOptions(), grpc::Status::OK);
  }

  enum class Next { kWrite, kWriteLast, kEnd };
  // Encodes the next chunk into buffer_ and says whether it is the last; or
  // ends the stream with `*end` (OK when there was nothing left to send).
  Next EncodeNext(absl::Status* end) ABSL_LOCKS_EXCLUDED(plan_mu_) {
    MutexLock lock(&plan_mu_);
    if (plan_released_) {
      *end = lifecycle_.BrokeOff(absl::CancelledError("fetch stream broke off"));
      return Next::kEnd;
    }
    if (block_ >= plan_.blocks.size()) return Next::kEnd;
    if (offset_ == 0) {
      // Compression switched off since planning: off means lossless for
      // fetches in flight too.
      if (plan_.blocks[block_]->compressed() && !plan_.MaySendLossy()) {
        *end = absl::AbortedError(
            "compression was switched off for this model while the fetch streamed; lossy "
            "blocks are no longer sent: retry the fetch");
        return Next::kEnd;
      }
      // What this block goes out as: stored bytes, or decoded ones.
      absl::StatusOr<FetchBlock> sent = MaterializeForFetch(plan_.blocks[block_], lossy_as_stored_);
      if (!sent.ok()) {
        *end = sent.status();
        return Next::kEnd;
      }
      current_ = *std::move(sent);
    }
    const PinnedBlock& block = current_.bytes;
    const uint64_t size = std::min(chunk_bytes_, block->size() - offset_);
    buffer_ = EncodeChunk(plan_.matched_tokens, plan_.withheld_tokens,
                          static_cast<uint32_t>(block_), block, offset_, size,
                          static_cast<v1::BlockEncoding>(current_.encoding), current_.kept_tokens);
    bytes_ += size;
    inflight_.AddBytes(size);
    offset_ += size;
    if (offset_ == block->size()) {
      // The chunks' slices hold their own references: drop ours, so a slow
      // reader pins only the blocks gRPC has not sent yet.
      plan_.blocks[block_].reset();
      current_ = FetchBlock();
      ++block_;
      offset_ = 0;
    }
    return block_ < plan_.blocks.size() ? Next::kWrite : Next::kWriteLast;
  }

  void Done(const absl::Status& status) {
    status_ = status;
    lifecycle_.ReleaseSlot();
    Finish(ToGrpcStatus(status));
  }

  CacheService* const service_;
  grpc::CallbackServerContext* const ctx_;
  const absl::Time start_ = absl::Now();
  // Guards plan_ and current_ against ReleasePlan(); reactions hold it
  // while they use them.
  Mutex plan_mu_;
  bool plan_released_ ABSL_GUARDED_BY(plan_mu_) = false;
  FetchPlan plan_ ABSL_GUARDED_BY(plan_mu_);
  bool lossy_as_stored_ = false;
  FetchBlock current_ ABSL_GUARDED_BY(plan_mu_);  // the block being sent
  uint64_t chunk_bytes_ = 0;
  size_t block_ = 0;
  uint64_t offset_ = 0;
  grpc::ByteBuffer buffer_;
  bool finished_with_write_ = false;  // the last chunk carried the status
  StreamLifecycle lifecycle_;
  const std::string request_id_;
  std::string model_;  // once the request parsed
  InflightCalls::Handle inflight_;
  uint64_t bytes_ = 0;
  absl::Status status_;
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* CacheService::Fetch(grpc::CallbackServerContext* ctx,
                                                                const grpc::ByteBuffer* request) {
  return new FetchReactor(this, ctx, request);
}

}  // namespace kvcache
