#include "server/checkpoint/checkpoint_mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/escaping.h"
#include "server/checkpoint/checkpoint_format.h"

namespace kvcache::checkpoint {
namespace {

constexpr absl::string_view kManifestPurpose = "kvcached checkpoint manifest";
constexpr absl::string_view kFramePurpose = "kvcached checkpoint frame";

std::string Hex(const uint8_t* bytes, size_t n) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), n));
}

bool ParseHex(absl::string_view hex, uint8_t* out, size_t n) {
  if (hex.size() != 2 * n) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  const std::string raw = absl::HexStringToBytes(hex);
  std::memcpy(out, raw.data(), n);
  return true;
}

}  // namespace

CheckpointId NewCheckpointId() {
  CheckpointId id;
  if (RAND_bytes(id.data(), static_cast<int>(id.size())) != 1) std::abort();  // as DaemonSecret
  return id;
}

std::string HexId(const CheckpointId& id) { return Hex(id.data(), id.size()); }

bool ParseHexId(absl::string_view hex, CheckpointId* id) {
  return ParseHex(hex, id->data(), id->size());
}

std::string ManifestMacHex(const CheckpointKey& key, absl::string_view body) {
  const SecretKey manifest_key =
      HmacSha256(key, std::string_view(kManifestPurpose.data(), kManifestPurpose.size()));
  const SecretKey mac = HmacSha256(manifest_key, std::string_view(body.data(), body.size()));
  return Hex(mac.data(), mac.size());
}

bool ManifestMacMatches(const CheckpointKey& key, absl::string_view body, absl::string_view hex) {
  SecretKey stored;
  if (!ParseHex(hex, stored.data(), stored.size())) return false;
  const SecretKey manifest_key =
      HmacSha256(key, std::string_view(kManifestPurpose.data(), kManifestPurpose.size()));
  return MacEquals(stored, HmacSha256(manifest_key, std::string_view(body.data(), body.size())));
}

// An HMAC context keyed once; each tag works on a copy of it, so the key's
// pads are hashed once per checkpoint, not once per frame.
struct FrameMac::State {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* keyed = nullptr;
  ~State() {
    EVP_MAC_CTX_free(keyed);
    EVP_MAC_free(mac);
  }
};

FrameMac::FrameMac(const CheckpointKey& key, const CheckpointId& id, uint64_t sequence)
    : state_(std::make_unique<State>()) {
  const SecretKey frame_key =
      HmacSha256(key, std::string_view(kFramePurpose.data(), kFramePurpose.size()));
  state_->mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  state_->keyed = state_->mac != nullptr ? EVP_MAC_CTX_new(state_->mac) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  if (state_->keyed == nullptr ||
      EVP_MAC_init(state_->keyed, frame_key.data(), frame_key.size(), params) != 1) {
    std::abort();  // HMAC-SHA256 is in every OpenSSL build kvcached supports
  }
  std::memcpy(prefix_.data(), id.data(), id.size());
  PutU64(prefix_.data() + id.size(), sequence);
}

FrameMac::~FrameMac() = default;

uint64_t FrameMac::Tag(const FrameHeader& header, uint64_t offset,
                       std::span<const std::byte> stored) const {
  std::byte fixed[24 + 8 + 16];
  std::memcpy(fixed, prefix_.data(), prefix_.size());
  PutU64(fixed + 24, offset);
  const auto encoded = EncodeFrameHeader(header);
  std::memcpy(fixed + 32, encoded.data(), 16);
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_dup(state_->keyed);
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t out_len = 0;
  if (ctx == nullptr ||
      EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(fixed), sizeof(fixed)) != 1 ||
      EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(stored.data()), stored.size()) !=
          1 ||
      EVP_MAC_final(ctx, out, &out_len, sizeof(out)) != 1 || out_len < 8) {
    std::abort();
  }
  EVP_MAC_CTX_free(ctx);
  return GetU64(reinterpret_cast<const std::byte*>(out));
}

}  // namespace kvcache::checkpoint
