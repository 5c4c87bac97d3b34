// kvcache._kvcache: the Python binding of kvcache::Client (client/include/kvcache/client.h).
//
// One implementation of the protocol: every call goes through the C++ client,
// so checksums (always sent on append, always verified on fetch), the
// shared-memory data plane, leases, retries, re-registration after a daemon
// restart and the lossy opt-in behave exactly as in C++. This file only
// translates: Python arguments to spans (no copy of KV or token buffers that
// are already contiguous), absl::Status to the exceptions of kvcache.errors,
// results to small read-only classes.
//
// Threads: the C++ Client is thread-safe; every call that may block (network,
// copies, checksums) runs with the GIL released, on a reference to the client
// taken while the GIL was held, so Client.close() in one thread never frees a
// client another thread is using. Buffers handed to a call are kept alive by
// the call's arguments while the GIL is released; the caller must not resize
// or free them from another thread meanwhile (as with any buffer-protocol
// consumer).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"
#include "kvcache/client.h"

namespace nb = nanobind;

namespace kvcache::python {
namespace {

// A non-OK status on its way to Python; the translator below raises the
// matching kvcache.errors class.
struct StatusError {
  absl::Status status;
};

[[noreturn]] void Throw(absl::Status status) { throw StatusError{std::move(status)}; }

[[noreturn]] void ThrowInvalid(std::string message) {
  Throw(absl::InvalidArgumentError(std::move(message)));
}

template <typename T>
T Unwrap(absl::StatusOr<T> result) {
  if (!result.ok()) Throw(result.status());
  return *std::move(result);
}

// Runs `f` with the GIL released and returns its result; errors are thrown
// only after the GIL is held again.
template <typename F>
auto NoGil(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

absl::Duration Seconds(double s) {
  if (s < 0) ThrowInvalid("a duration must not be negative");
  return absl::Seconds(s);
}

// Token ids: a C-contiguous 1-D uint32 array (numpy, torch via DLPack, ...) is
// used in place; any other iterable of ints is copied, each checked to be a
// uint32.
class Tokens {
 public:
  explicit Tokens(nb::handle h) {
    using Array = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    if (nb::try_cast(h, array_, /*convert=*/false)) {
      span_ = {array_.data(), array_.shape(0)};
      return;
    }
    if (nb::isinstance<nb::str>(h) || nb::isinstance<nb::bytes>(h)) {
      ThrowInvalid("tokens must be a sequence of ints, not str or bytes");
    }
    size_t i = 0;
    for (nb::handle item : nb::iter(h)) {
      PyObject* index = PyNumber_Index(item.ptr());
      if (index == nullptr) {
        PyErr_Clear();
        ThrowInvalid("tokens[" + std::to_string(i) + "] is not an int");
      }
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
      Py_DECREF(index);
      if (overflow != 0 || v < 0 || v > 0xffffffffLL) {
        ThrowInvalid("tokens[" + std::to_string(i) + "] is not a uint32 token id");
      }
      owned_.push_back(static_cast<uint32_t>(v));
      ++i;
    }
    span_ = owned_;
  }
  std::span<const uint32_t> span() const { return span_; }

 private:
  nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> array_;
  std::vector<uint32_t> owned_;
  std::span<const uint32_t> span_;
};

// KV a call reads (append) or writes (fetch): any C-contiguous CPU array of
// any dtype (numpy, bytes/bytearray/memoryview through the buffer protocol,
// torch CPU tensors through DLPack), taken as its bytes.
using InBuffer = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using OutBuffer = nb::ndarray<nb::c_contig, nb::device::cpu>;

std::span<const std::byte> Bytes(const InBuffer& a) {
  return {static_cast<const std::byte*>(a.data()), a.nbytes()};
}
std::span<std::byte> Bytes(const OutBuffer& a) {
  return {static_cast<std::byte*>(a.data()), a.nbytes()};
}

v1::DType ParseDtype(std::string_view s) {
  if (s == "fp16" || s == "float16") return v1::DTYPE_FP16;
  if (s == "bf16" || s == "bfloat16") return v1::DTYPE_BF16;
  if (s == "fp32" || s == "float32") return v1::DTYPE_FP32;
  ThrowInvalid("dtype must be 'fp16', 'bf16' or 'fp32', not '" + std::string(s) + "'");
}

DataPath ParseDataPath(std::string_view s) {
  if (s == "auto") return DataPath::kAuto;
  if (s == "grpc") return DataPath::kGrpc;
  if (s == "shm") return DataPath::kSharedMemory;
  ThrowInvalid("data_path must be 'auto', 'grpc' or 'shm', not '" + std::string(s) + "'");
}

v1::PrefetchMode ParsePrefetch(std::string_view s) {
  if (s == "none") return v1::PREFETCH_NONE;
  if (s == "best_effort") return v1::PREFETCH_BEST_EFFORT;
  if (s == "wait") return v1::PREFETCH_WAIT;
  ThrowInvalid("prefetch must be 'none', 'best_effort' or 'wait', not '" + std::string(s) + "'");
}

// A proto message as a dict (proto3 JSON with the proto's field names, 64-bit
// integers as strings as the JSON mapping says).
nb::object ToDict(const google::protobuf::Message& m) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(m, &json, options).ok()) {
    Throw(absl::InternalError("cannot render " + m.GetTypeName() + " as JSON"));
  }
  return nb::module_::import_("json").attr("loads")(json);
}

std::optional<double> UnixSeconds(absl::Time t) {
  if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) return std::nullopt;
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

// --- results -------------------------------------------------------------------

struct BlockInfo {
  uint32_t index;
  uint64_t key;
  uint64_t checksum;
  uint64_t bytes;
  bool lossy;
};

struct PyLookupResult {
  uint64_t matched_tokens = 0;
  uint64_t withheld_tokens = 0;
  uint64_t lease_id = 0;
  std::optional<double> lease_expires;
  std::vector<BlockInfo> blocks;
};

PyLookupResult Convert(const LookupResult& r) {
  PyLookupResult out{
      r.matched_tokens, r.withheld_tokens, r.lease_id, UnixSeconds(r.lease_expires), {}};
  out.blocks.reserve(r.blocks.size());
  for (const v1::BlockDescriptor& b : r.blocks) {
    out.blocks.push_back({b.index(), b.key(), b.checksum(), b.bytes(), b.lossy()});
  }
  return out;
}

struct RegisterResult {
  bool created;
  uint64_t block_bytes;
  uint32_t block_tokens;
};

// A region of memory shared with the daemon (kvcache::SharedRegion).
class PyRegion {
 public:
  explicit PyRegion(std::shared_ptr<SharedRegion> region) : region_(std::move(region)) {}
  std::span<std::byte> bytes() const { return region_->bytes(); }

 private:
  std::shared_ptr<SharedRegion> region_;
};

// --- the client ----------------------------------------------------------------

class PyClient {
 public:
  explicit PyClient(const ClientOptions& options) : client_(Unwrap(Client::Connect(options))) {}

  // The client for one call; FAILED_PRECONDITION after close().
  std::shared_ptr<Client> Get() const {
    if (client_ == nullptr) Throw(absl::FailedPreconditionError("the kvcache.Client is closed"));
    return client_;
  }

  void Close() {
    std::shared_ptr<Client> client = std::move(client_);
    client_ = nullptr;
    nb::gil_scoped_release release;
    client.reset();  // joins the client's threads when no call still holds it
  }
  bool closed() const { return client_ == nullptr; }

 private:
  std::shared_ptr<Client> client_;
};

ClientOptions MakeOptions(std::string target, std::string ns, double timeout, int max_attempts,
                          std::string_view data_path, std::string token, std::string shm_socket,
                          uint64_t max_message_bytes, int max_shm_connections,
                          uint64_t shm_staging_bytes, std::string tls_ca_file,
                          std::string tls_cert_file, std::string tls_key_file,
                          std::string tls_server_name) {
  ClientOptions o;
  o.target = std::move(target);
  o.ns = std::move(ns);
  o.timeout = Seconds(timeout);
  if (max_attempts < 1) ThrowInvalid("max_attempts must be at least 1");
  o.max_attempts = max_attempts;
  o.data_path = ParseDataPath(data_path);
  o.token = std::move(token);
  o.shm_socket = std::move(shm_socket);
  o.max_message_bytes = max_message_bytes;
  if (max_shm_connections < 1) ThrowInvalid("max_shm_connections must be at least 1");
  o.max_shm_connections = max_shm_connections;
  o.shm_staging_bytes = shm_staging_bytes;
  o.tls_ca_file = std::move(tls_ca_file);
  o.tls_cert_file = std::move(tls_cert_file);
  o.tls_key_file = std::move(tls_key_file);
  o.tls_server_name = std::move(tls_server_name);
  return o;
}

LookupOptions MakeLookupOptions(bool lease, double lease_ttl, bool accept_lossy,
                                std::string_view prefetch, double prefetch_timeout) {
  LookupOptions o;
  o.acquire_lease = lease;
  o.lease_ttl = Seconds(lease_ttl);
  o.accept_lossy = accept_lossy;
  o.prefetch = ParsePrefetch(prefetch);
  o.prefetch_timeout = Seconds(prefetch_timeout);
  return o;
}

void RaiseStatus(const absl::Status& status) {
  nb::object errors = nb::module_::import_("kvcache.errors");
  nb::object exc =
      errors.attr("_from_status")(static_cast<int>(status.code()), std::string(status.message()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

}  // namespace
}  // namespace kvcache::python

NB_MODULE(_kvcache, m) {
  using namespace kvcache;          // NOLINT(build/namespaces)
  using namespace kvcache::python;  // NOLINT(build/namespaces)
  m.doc() = "The compiled half of the kvcache package: kvcache::Client bound with nanobind.";
  m.attr("__version__") = KVCACHE_PY_VERSION;

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatus(e.status);
    }
  });

  m.def(
      "block_checksum",
      [](InBuffer data) {
        auto bytes = Bytes(data);
        return NoGil([&] { return BlockChecksum(bytes); });
      },
      nb::arg("data"), "XXH3-64 of a buffer's bytes: the checksum kvcached records for a block.");

  nb::class_<BlockInfo>(m, "BlockInfo", "One cached block of a looked-up prefix.")
      .def_ro("index", &BlockInfo::index, "position of the block in the sequence (0-based)")
      .def_ro("key", &BlockInfo::key, "chained hash of the tokens up to the block's end")
      .def_ro("checksum", &BlockInfo::checksum, "XXH3-64 of the bytes a fetch returns")
      .def_ro("nbytes", &BlockInfo::bytes, "the block's bytes (the layout's block_bytes)")
      .def_ro("lossy", &BlockInfo::lossy, "stored lossy (only with accept_lossy)")
      .def("__repr__", [](const BlockInfo& b) {
        return "BlockInfo(index=" + std::to_string(b.index) +
               ", nbytes=" + std::to_string(b.bytes) + (b.lossy ? ", lossy=True)" : ")");
      });

  nb::class_<PyLookupResult>(m, "LookupResult", "What Client.lookup found.")
      .def_ro("matched_tokens", &PyLookupResult::matched_tokens,
              "tokens of the longest cached prefix (whole blocks)")
      .def_ro("withheld_tokens", &PyLookupResult::withheld_tokens,
              "cached tokens past matched_tokens left out because they are stored lossy")
      .def_ro("lease_id", &PyLookupResult::lease_id, "the lease (0: none)")
      .def_ro("lease_expires", &PyLookupResult::lease_expires,
              "when the lease expires, seconds since the Unix epoch (None: no lease)")
      .def_ro("blocks", &PyLookupResult::blocks, "the matched blocks")
      .def("__repr__", [](const PyLookupResult& r) {
        return "LookupResult(matched_tokens=" + std::to_string(r.matched_tokens) +
               ", withheld_tokens=" + std::to_string(r.withheld_tokens) +
               ", lease_id=" + std::to_string(r.lease_id) +
               ", blocks=" + std::to_string(r.blocks.size()) + ")";
      });

  nb::class_<RegisterResult>(m, "RegisterResult", "What Client.register_model did.")
      .def_ro("created", &RegisterResult::created,
              "False when the same id and layout were registered already")
      .def_ro("block_bytes", &RegisterResult::block_bytes, "bytes of KV in one block")
      .def_ro("block_tokens", &RegisterResult::block_tokens, "tokens in one block")
      .def("__repr__", [](const RegisterResult& r) {
        return std::string("RegisterResult(created=") + (r.created ? "True" : "False") +
               ", block_bytes=" + std::to_string(r.block_bytes) +
               ", block_tokens=" + std::to_string(r.block_tokens) + ")";
      });

  nb::class_<AppendResult>(m, "AppendResult", "What Client.append stored.")
      .def_ro("stored_blocks", &AppendResult::stored_blocks, "blocks stored by this append")
      .def_ro("deduplicated_blocks", &AppendResult::deduplicated_blocks,
              "blocks that were cached already with the same bytes")
      .def_ro("stored_bytes", &AppendResult::stored_bytes, "bytes stored by this append")
      .def_ro("cached_tokens", &AppendResult::cached_tokens,
              "tokens of the sequence cached after the append")
      .def_ro("conflicting_blocks", &AppendResult::conflicting_blocks,
              "blocks cached with other bytes than this append carried (the cached copy kept)")
      .def_ro("first_conflicting_block", &AppendResult::first_conflicting_block,
              "the first of them (-1: none)")
      .def_ro("restored_blocks", &AppendResult::restored_blocks,
              "lossy blocks made exact again by these bytes")
      .def_ro("pending_blocks", &AppendResult::pending_blocks,
              "blocks being stored by another append in flight")
      .def("__repr__", [](const AppendResult& r) {
        return "AppendResult(stored_blocks=" + std::to_string(r.stored_blocks) +
               ", deduplicated_blocks=" + std::to_string(r.deduplicated_blocks) +
               ", cached_tokens=" + std::to_string(r.cached_tokens) +
               ", conflicting_blocks=" + std::to_string(r.conflicting_blocks) + ")";
      });

  nb::class_<FetchResult>(m, "FetchResult", "What Client.fetch wrote, every block verified.")
      .def_ro("matched_tokens", &FetchResult::matched_tokens, "tokens fetched (whole blocks)")
      .def_ro("blocks", &FetchResult::blocks, "blocks written")
      .def_ro("nbytes", &FetchResult::bytes, "bytes written to the output, from its start")
      .def_ro("dequantized_blocks", &FetchResult::dequantized_blocks,
              "lossy blocks decoded by the daemon (only with accept_lossy)")
      .def_ro("withheld_tokens", &FetchResult::withheld_tokens,
              "cached tokens past matched_tokens left out because they are stored lossy")
      .def_ro("kept_tokens", &FetchResult::kept_tokens,
              "per block, the block-local positions of tokens kept by pruning (empty: none "
              "pruned)")
      .def("__repr__", [](const FetchResult& r) {
        return "FetchResult(matched_tokens=" + std::to_string(r.matched_tokens) +
               ", blocks=" + std::to_string(r.blocks) + ", nbytes=" + std::to_string(r.bytes) +
               ", withheld_tokens=" + std::to_string(r.withheld_tokens) + ")";
      });

  nb::class_<EvictResult>(m, "EvictResult", "What an eviction removed.")
      .def_ro("evicted_blocks", &EvictResult::evicted_blocks)
      .def_ro("evicted_bytes", &EvictResult::evicted_bytes)
      .def("__repr__", [](const EvictResult& r) {
        return "EvictResult(evicted_blocks=" + std::to_string(r.evicted_blocks) +
               ", evicted_bytes=" + std::to_string(r.evicted_bytes) + ")";
      });

  nb::class_<DataPathStats>(m, "DataPathStats", "How this client's data calls have travelled.")
      .def_ro("shared_memory", &DataPathStats::shared_memory,
              "data calls go over shared memory now")
      .def_ro("shm_probes", &DataPathStats::shm_probes, "attempts to open the shared-memory path")
      .def_ro("grpc_fallbacks", &DataPathStats::grpc_fallbacks,
              "calls under data_path='auto' that went to gRPC instead")
      .def_ro("fallback_reason", &DataPathStats::fallback_reason,
              "why the last attempt failed; empty once one succeeded")
      .def("__repr__", [](const DataPathStats& s) {
        return std::string("DataPathStats(shared_memory=") + (s.shared_memory ? "True" : "False") +
               ", shm_probes=" + std::to_string(s.shm_probes) +
               ", grpc_fallbacks=" + std::to_string(s.grpc_fallbacks) + ")";
      });

  nb::class_<PyRegion>(m, "SharedRegion",
                       "Memory shared with the daemon: fetches into it and appends from it cost "
                       "one copy, made by the daemon.")
      .def_prop_ro(
          "nbytes", [](const PyRegion& r) { return r.bytes().size(); }, "the region's size")
      .def_prop_ro(
          "array",
          [](nb::handle self) {
            std::span<std::byte> bytes = nb::cast<const PyRegion&>(self).bytes();
            return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(bytes.data(), {bytes.size()}, self);
          },
          "The region as a writable 1-D numpy uint8 array (no copy; it keeps the region "
          "alive). Slice it and .view() it as the model's dtype; fetch into and append from "
          "slices of it.")
      .def("__len__", [](const PyRegion& r) { return r.bytes().size(); })
      .def("__repr__", [](const PyRegion& r) {
        return "SharedRegion(nbytes=" + std::to_string(r.bytes().size()) + ")";
      });

  nb::class_<PyClient>(m, "_Client")
      .def(
          "__init__",
          [](PyClient* self, std::string target, std::string ns, double timeout, int max_attempts,
             std::string_view data_path, std::string token, std::string shm_socket,
             uint64_t max_message_bytes, int max_shm_connections, uint64_t shm_staging_bytes,
             std::string tls_ca_file, std::string tls_cert_file, std::string tls_key_file,
             std::string tls_server_name) {
            ClientOptions o = MakeOptions(std::move(target), std::move(ns), timeout, max_attempts,
                                          data_path, std::move(token), std::move(shm_socket),
                                          max_message_bytes, max_shm_connections, shm_staging_bytes,
                                          std::move(tls_ca_file), std::move(tls_cert_file),
                                          std::move(tls_key_file), std::move(tls_server_name));
            new (self) PyClient(o);
          },
          nb::arg("target"), nb::arg("namespace"), nb::arg("timeout"), nb::arg("max_attempts"),
          nb::arg("data_path"), nb::arg("token"), nb::arg("shm_socket"),
          nb::arg("max_message_bytes"), nb::arg("max_shm_connections"),
          nb::arg("shm_staging_bytes"), nb::arg("tls_ca_file"), nb::arg("tls_cert_file"),
          nb::arg("tls_key_file"), nb::arg("tls_server_name"))
      .def("close", &PyClient::Close)
      .def_prop_ro("closed", &PyClient::closed)
      .def("wait_for_ready",
           [](const PyClient& c, double timeout) {
             auto client = c.Get();
             absl::Duration d = Seconds(timeout);
             absl::Status s = NoGil([&] { return client->WaitForReady(d); });
             if (!s.ok()) Throw(s);
           })
      .def("register_model",
           [](const PyClient& c, std::string model_id, uint32_t num_layers, uint32_t num_kv_heads,
              uint32_t head_dim, std::string_view dtype, uint32_t block_tokens) {
             auto client = c.Get();
             v1::ModelLayout layout;
             layout.set_num_layers(num_layers);
             layout.set_num_kv_heads(num_kv_heads);
             layout.set_head_dim(head_dim);
             layout.set_dtype(ParseDtype(dtype));
             layout.set_block_tokens(block_tokens);
             auto r = Unwrap(NoGil([&] { return client->RegisterModel(model_id, layout); }));
             return RegisterResult{r.created(), r.block_bytes(), r.layout().block_tokens()};
           })
      .def("unregister_model",
           [](const PyClient& c, std::string model_id) {
             auto client = c.Get();
             auto r = Unwrap(NoGil([&] { return client->UnregisterModel(model_id); }));
             return ToDict(r);
           })
      .def("lookup",
           [](const PyClient& c, std::string model_id, nb::handle tokens, bool lease,
              double lease_ttl, bool accept_lossy, std::string_view prefetch,
              double prefetch_timeout) {
             auto client = c.Get();
             Tokens t(tokens);
             LookupOptions o =
                 MakeLookupOptions(lease, lease_ttl, accept_lossy, prefetch, prefetch_timeout);
             return Convert(Unwrap(NoGil([&] { return client->Lookup(model_id, t.span(), o); })));
           })
      .def("batch_lookup",
           [](const PyClient& c, std::string model_id, nb::handle sequences, bool lease,
              double lease_ttl, bool accept_lossy, std::string_view prefetch,
              double prefetch_timeout) {
             auto client = c.Get();
             std::vector<Tokens> seqs;
             for (nb::handle s : nb::iter(sequences)) seqs.emplace_back(s);
             std::vector<std::span<const uint32_t>> spans;
             for (const Tokens& t : seqs) spans.push_back(t.span());
             LookupOptions o =
                 MakeLookupOptions(lease, lease_ttl, accept_lossy, prefetch, prefetch_timeout);
             auto results =
                 Unwrap(NoGil([&] { return client->BatchLookup(model_id, std::span(spans), o); }));
             nb::list out;
             nb::object errors = nb::module_::import_("kvcache.errors");
             for (const absl::StatusOr<LookupResult>& r : results) {
               if (r.ok()) {
                 out.append(nb::cast(Convert(*r)));
               } else {
                 out.append(errors.attr("_from_status")(static_cast<int>(r.status().code()),
                                                        std::string(r.status().message())));
               }
             }
             return out;
           })
      .def("release_lease",
           [](const PyClient& c, uint64_t lease_id) {
             auto client = c.Get();
             return Unwrap(NoGil([&] { return client->ReleaseLease(lease_id); }));
           })
      .def(
          "append",
          [](const PyClient& c, std::string model_id, nb::handle tokens, InBuffer kv,
             uint64_t start_token) {
            auto client = c.Get();
            Tokens t(tokens);
            AppendOptions o;
            o.start_token = start_token;
            std::span<const std::byte> bytes = Bytes(kv);
            return Unwrap(NoGil([&] { return client->Append(model_id, t.span(), bytes, o); }));
          },
          nb::arg("model_id"), nb::arg("tokens"), nb::arg("kv"), nb::arg("start_token"))
      .def(
          "fetch",
          [](const PyClient& c, std::string model_id, nb::handle tokens, OutBuffer out,
             bool accept_lossy) {
            auto client = c.Get();
            Tokens t(tokens);
            FetchOptions o;
            o.accept_lossy = accept_lossy;
            std::span<std::byte> bytes = Bytes(out);
            return Unwrap(NoGil([&] { return client->Fetch(model_id, t.span(), bytes, o); }));
          },
          nb::arg("model_id"), nb::arg("tokens"), nb::arg("out").noconvert(),
          nb::arg("accept_lossy"))
      .def(
          "fetch_lease",
          [](const PyClient& c, std::string model_id, uint64_t lease_id, OutBuffer out,
             bool accept_lossy) {
            auto client = c.Get();
            FetchOptions o;
            o.accept_lossy = accept_lossy;
            std::span<std::byte> bytes = Bytes(out);
            return Unwrap(NoGil([&] { return client->FetchLease(model_id, lease_id, bytes, o); }));
          },
          nb::arg("model_id"), nb::arg("lease_id"), nb::arg("out").noconvert(),
          nb::arg("accept_lossy"))
      .def("create_shared_region",
           [](const PyClient& c, uint64_t nbytes) {
             auto client = c.Get();
             return PyRegion(Unwrap(NoGil([&] { return client->CreateSharedRegion(nbytes); })));
           })
      .def("uses_shared_memory",
           [](const PyClient& c) {
             auto client = c.Get();
             return NoGil([&] { return client->UsesSharedMemory(); });
           })
      .def("data_path_stats",
           [](const PyClient& c) {
             auto client = c.Get();
             return NoGil([&] { return client->GetDataPathStats(); });
           })
      .def("evict_prefix",
           [](const PyClient& c, std::string model_id, nb::handle tokens) {
             auto client = c.Get();
             Tokens t(tokens);
             return Unwrap(NoGil([&] { return client->EvictPrefix(model_id, t.span()); }));
           })
      .def("evict_model",
           [](const PyClient& c, std::string model_id) {
             auto client = c.Get();
             return Unwrap(NoGil([&] { return client->EvictModel(model_id); }));
           })
      .def("server_info",
           [](const PyClient& c) {
             auto client = c.Get();
             return ToDict(Unwrap(NoGil([&] { return client->GetServerInfo(); })));
           })
      .def("list_models",
           [](const PyClient& c, std::string ns) {
             auto client = c.Get();
             return ToDict(Unwrap(NoGil([&] { return client->ListModels(ns); })));
           })
      .def("stats",
           [](const PyClient& c) {
             auto client = c.Get();
             return ToDict(Unwrap(NoGil([&] { return client->GetStats(); })));
           })
      .def("who_am_i", [](const PyClient& c) {
        auto client = c.Get();
        return ToDict(Unwrap(NoGil([&] { return client->WhoAmI(); })));
      });
}
