#include "server/remote/remote_key.h"

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvcache {

RemoteKeyChain::RemoteKeyChain(const DaemonSecret& shared, const ModelKey& model,
                               const ModelLayout& layout)
    : block_tokens_(layout.block_tokens) {
  std::string purpose = "remote-key";
  for (const std::string& part :
       {model.ns, model.model_id,
        absl::StrCat("layers=", layout.num_layers, ",kv_heads=", layout.num_kv_heads,
                     ",head_dim=", layout.head_dim, ",dtype=", static_cast<int>(layout.dtype),
                     ",block_tokens=", layout.block_tokens)}) {
    purpose.push_back('\0');
    purpose.append(part);
  }
  model_key_ = shared.Derive(purpose);
}

std::vector<std::string> RemoteKeyChain::KeysOf(std::span<const Token> tokens) const {
  const size_t blocks = block_tokens_ == 0 ? 0 : tokens.size() / block_tokens_;
  std::vector<std::string> keys;
  keys.reserve(blocks);
  std::vector<uint8_t> input;
  input.reserve(kKeyBytes + 4 * size_t{block_tokens_});
  SecretKey previous{};
  for (size_t b = 0; b < blocks; ++b) {
    input.clear();
    if (b > 0) input.insert(input.end(), previous.begin(), previous.begin() + kKeyBytes);
    for (const Token t : tokens.subspan(b * block_tokens_, block_tokens_)) {
      for (int shift = 0; shift < 32; shift += 8) input.push_back(static_cast<uint8_t>(t >> shift));
    }
    previous = HmacSha256(model_key_, input);
    keys.push_back(
        absl::StrCat("kvc:", absl::BytesToHexString(absl::string_view(
                                 reinterpret_cast<const char*>(previous.data()), kKeyBytes))));
  }
  return keys;
}

}  // namespace kvcache
