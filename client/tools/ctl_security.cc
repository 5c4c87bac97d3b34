// kvcachectl's side of authentication: the bearer token it sends, and
// `whoami` (docs/security.md).
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "ctl_commands.h"

namespace kvcache::ctl {

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  if (path.empty()) {
    const char* env = std::getenv("KVCACHE_TOKEN");
    return std::string(env == nullptr ? "" : absl::StripAsciiWhitespace(env));
  }
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string token(absl::StripAsciiWhitespace(text));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token-file ", path, " cannot be read or holds no token"));
  }
  return token;
}

int RunWhoAmI(const Context& ctx) {
  absl::StatusOr<v1::WhoAmIResponse> resp = ctx.client->WhoAmI();
  if (!resp.ok()) return FailCall(ctx, "whoami", resp.status());
  if (ctx.json) {
    *ctx.out << ToJson(*resp) << '\n';
    return kExitOk;
  }
  *ctx.out << "principal: " << resp->principal() << '\n'
           << "tenant: " << resp->tenant() << '\n'
           << "role: " << resp->role() << '\n'
           << "authenticated by: " << resp->authenticated_by() << '\n';
  if (resp->shared_namespaces_size() > 0) {
    *ctx.out << "shared namespaces:";
    for (const std::string& ns : resp->shared_namespaces()) *ctx.out << ' ' << ns;
    *ctx.out << '\n';
  }
  return kExitOk;
}

}  // namespace kvcache::ctl
