#include "server/remote/value_seal.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

struct CipherFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using CipherContext = std::unique_ptr<EVP_CIPHER_CTX, CipherFree>;

// Every value has a key of its own: the nonce may be the same for all.
constexpr std::array<uint8_t, 12> kNonce{};

std::string AssociatedData(std::string_view ns, std::string_view store_key) {
  std::string aad = "kvcache-remote-v1";
  aad.push_back('\0');
  aad.append(ns);
  aad.push_back('\0');
  aad.append(store_key);
  return aad;
}

// Calls update(piece, length, offset) for `bytes` in pieces an int can count.
template <typename Update>
bool InPieces(const uint8_t* bytes, size_t size, size_t offset, Update update) {
  constexpr size_t kPiece = size_t{1} << 30;
  for (size_t at = 0; at < size; at += kPiece) {
    const size_t n = std::min(kPiece, size - at);
    if (!update(bytes + at, static_cast<int>(n), offset + at)) return false;
  }
  return true;
}

// A decryption of a value sealed under `key`, its associated data `aad`
// taken in; null when OpenSSL cannot start one.
CipherContext StartDecrypting(const SecretKey& key, std::string_view aad) {
  CipherContext ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  if (ctx == nullptr ||
      EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), kNonce.data()) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &n, reinterpret_cast<const uint8_t*>(aad.data()),
                        static_cast<int>(aad.size())) != 1) {
    return nullptr;
  }
  return ctx;
}

}  // namespace

SecretKey ValueSealer::ValueKey(std::string_view ns, std::span<const uint8_t> salt) const {
  std::string purpose = "remote-seal";
  purpose.push_back('\0');
  purpose.append(ns);
  return HmacSha256(shared_.Derive(purpose), salt);
}

void ValueSealer::Seal(std::string_view ns, std::string_view store_key,
                       std::span<const std::byte> plaintext, std::string* out) const {
  const std::span<const std::byte> pieces[] = {plaintext};
  Seal(ns, store_key, pieces, out);
}

void ValueSealer::Seal(std::string_view ns, std::string_view store_key,
                       std::span<const std::span<const std::byte>> plaintext,
                       std::string* out) const {
  size_t plain_bytes = 0;
  for (const auto& piece : plaintext) plain_bytes += piece.size();
  std::array<uint8_t, kSaltBytes> salt;
  if (RAND_bytes(salt.data(), static_cast<int>(salt.size())) != 1) std::abort();
  const SecretKey key = ValueKey(ns, salt);
  const std::string aad = AssociatedData(ns, store_key);
  const size_t start = out->size();
  out->resize(start + kOverheadBytes + plain_bytes);
  auto* dst = reinterpret_cast<uint8_t*>(out->data() + start);
  dst[0] = kVersion;
  std::memcpy(dst + 1, salt.data(), salt.size());
  uint8_t* body = dst + 1 + kSaltBytes;
  CipherContext ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  bool ok =
      ctx != nullptr &&
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), kNonce.data()) == 1 &&
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, reinterpret_cast<const uint8_t*>(aad.data()),
                        static_cast<int>(aad.size())) == 1;
  size_t at = 0;
  for (const auto& piece : plaintext) {
    ok = ok && InPieces(reinterpret_cast<const uint8_t*>(piece.data()), piece.size(), at,
                        [&](const uint8_t* p, int len, size_t offset) {
                          return EVP_EncryptUpdate(ctx.get(), body + offset, &n, p, len) == 1;
                        });
    at += piece.size();
  }
  ok = ok && EVP_EncryptFinal_ex(ctx.get(), body + plain_bytes, &n) == 1 &&
       EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, body + plain_bytes) == 1;
  if (!ok) std::abort();  // AES-256-GCM is in every OpenSSL build kvcached supports
}

absl::Status ValueSealer::Peek(std::string_view ns, std::string_view store_key,
                               std::string_view sealed, std::span<std::byte> out) const {
  if (sealed.size() < kOverheadBytes || out.size() > OpenedBytes(sealed.size())) {
    return absl::DataLossError(absl::StrCat("a sealed value of ", sealed.size(), " bytes holds no ",
                                            out.size(), "-byte header"));
  }
  const auto* src = reinterpret_cast<const uint8_t*>(sealed.data());
  if (src[0] != kVersion) {
    return absl::DataLossError(
        absl::StrCat("the sealed value is of version ", int{src[0]}, ", not ", int{kVersion}));
  }
  CipherContext ctx =
      StartDecrypting(ValueKey(ns, {src + 1, kSaltBytes}), AssociatedData(ns, store_key));
  int n = 0;
  if (ctx == nullptr ||
      EVP_DecryptUpdate(ctx.get(), reinterpret_cast<uint8_t*>(out.data()), &n, src + 1 + kSaltBytes,
                        static_cast<int>(out.size())) != 1) {
    return absl::InternalError("AES-256-GCM could not start");
  }
  return absl::OkStatus();
}

absl::Status ValueSealer::Open(std::string_view ns, std::string_view store_key,
                               std::string_view sealed, std::span<std::byte> out) const {
  const std::span<std::byte> pieces[] = {out};
  return Open(ns, store_key, sealed, pieces);
}

absl::Status ValueSealer::Open(std::string_view ns, std::string_view store_key,
                               std::string_view sealed,
                               std::span<const std::span<std::byte>> out) const {
  size_t out_bytes = 0;
  for (const auto& piece : out) out_bytes += piece.size();
  if (sealed.size() < kOverheadBytes) {
    return absl::DataLossError(absl::StrCat("the sealed value has ", sealed.size(),
                                            " bytes, fewer than a seal's ", kOverheadBytes));
  }
  if (out_bytes != OpenedBytes(sealed.size())) {
    return absl::InvalidArgumentError(absl::StrCat("a sealed value of ", sealed.size(),
                                                   " bytes opens into ", OpenedBytes(sealed.size()),
                                                   " bytes, not ", out_bytes));
  }
  const auto* src = reinterpret_cast<const uint8_t*>(sealed.data());
  if (src[0] != kVersion) {
    return absl::DataLossError(
        absl::StrCat("the sealed value is of version ", int{src[0]}, ", not ", int{kVersion}));
  }
  const uint8_t* body = src + 1 + kSaltBytes;
  std::array<uint8_t, kTagBytes> tag;
  std::memcpy(tag.data(), body + out_bytes, kTagBytes);
  CipherContext ctx =
      StartDecrypting(ValueKey(ns, {src + 1, kSaltBytes}), AssociatedData(ns, store_key));
  int n = 0;
  bool ok = ctx != nullptr;
  size_t at = 0;
  for (const auto& piece : out) {
    ok = ok && InPieces(body + at, piece.size(), 0, [&](const uint8_t* p, int len, size_t offset) {
           return EVP_DecryptUpdate(ctx.get(), reinterpret_cast<uint8_t*>(piece.data()) + offset,
                                    &n, p, len) == 1;
         });
    at += piece.size();
  }
  uint8_t final_block[16];
  ok = ok && EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag.data()) == 1 &&
       EVP_DecryptFinal_ex(ctx.get(), final_block, &n) == 1;
  if (!ok) {
    return absl::DataLossError(
        "the sealed value does not open: changed, cut, stored under another key or namespace, "
        "or sealed with another secret");
  }
  return absl::OkStatus();
}

}  // namespace kvcache
