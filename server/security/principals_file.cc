#include "server/security/principals_file.h"

#include <openssl/sha.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/core/layout.h"

namespace kvcache {

namespace {

constexpr size_t kMinTokenChars = 16;
constexpr size_t kMaxPrincipals = 100000;

bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status Bad(std::string_view who, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("principals file: ", std::string(who), ": ", std::string(what)));
}

}  // namespace

std::string Sha256(std::string_view text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

const Principal* PrincipalTable::FindToken(std::string_view token) const {
  auto it = by_token_digest_.find(Sha256(token));
  return it == by_token_digest_.end() ? nullptr : &it->second;
}

const Principal* PrincipalTable::FindCertificate(std::string_view identity) const {
  auto it = by_certificate_.find(std::string(identity));
  return it == by_certificate_.end() ? nullptr : &it->second;
}

const Principal* PrincipalTable::FindUid(uid_t uid) const {
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? nullptr : &it->second;
}

absl::StatusOr<PrincipalTable> ParsePrincipals(std::string_view json) {
  nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Bad("the file", "is not valid JSON");
  if (!doc.is_object()) return Bad("the file", "must be a JSON object");
  for (auto& [key, value] : doc.items()) {
    if (key != "principals") return Bad("the file", absl::StrCat("unknown field \"", key, "\""));
  }
  auto list = doc.find("principals");
  if (list == doc.end() || !list->is_array()) {
    return Bad("the file", "needs \"principals\": [...]");
  }
  if (list->size() > kMaxPrincipals) {
    return Bad("the file", absl::StrCat("has more than ", kMaxPrincipals, " principals"));
  }
  PrincipalTable table;
  absl::flat_hash_set<std::string> names;
  size_t index = 0;
  for (const nlohmann::json& entry : *list) {
    std::string who = absl::StrCat("principal #", index++);
    if (!entry.is_object()) return Bad(who, "must be an object");
    auto name = entry.find("name");
    if (name == entry.end() || !name->is_string() || name->get<std::string>().empty()) {
      return Bad(who, "needs a \"name\"");
    }
    Principal p;
    p.name = name->get<std::string>();
    who = absl::StrCat("principal \"", p.name, "\"");
    if (!names.insert(p.name).second) return Bad(who, "the name is used twice");
    int credentials = 0;
    std::string token_digest;
    std::string certificate;
    int64_t uid = -1;
    bool has_role = false;
    for (auto& [key, value] : entry.items()) {
      if (key == "name") continue;
      if (key == "tenant") {
        if (!value.is_string()) return Bad(who, "\"tenant\" must be a string");
        p.tenant = value.get<std::string>();
        if (absl::Status s = ValidateIdentifier("tenant", p.tenant); !s.ok()) {
          return Bad(who, std::string(s.message()));
        }
      } else if (key == "role") {
        std::optional<Role> role =
            value.is_string() ? ParseRole(value.get<std::string>()) : std::nullopt;
        if (!role.has_value()) return Bad(who, "\"role\" must be reader, worker or admin");
        p.role = *role;
        has_role = true;
      } else if (key == "token") {
        if (!value.is_string() || value.get<std::string>().size() < kMinTokenChars) {
          return Bad(who, absl::StrCat("\"token\" must be a string of at least ", kMinTokenChars,
                                       " characters"));
        }
        token_digest = Sha256(value.get<std::string>());
        ++credentials;
        p.authenticated_by = AuthMethod::kToken;
      } else if (key == "token_sha256") {
        std::string hex = value.is_string() ? value.get<std::string>() : "";
        if (hex.size() != 64 || !IsLowerHex(hex)) {
          return Bad(who, "\"token_sha256\" must be 64 lower-case hex digits");
        }
        token_digest = absl::HexStringToBytes(hex);
        ++credentials;
        p.authenticated_by = AuthMethod::kToken;
      } else if (key == "certificate") {
        if (!value.is_string() || value.get<std::string>().empty()) {
          return Bad(who, "\"certificate\" must be a non-empty identity");
        }
        certificate = value.get<std::string>();
        ++credentials;
        p.authenticated_by = AuthMethod::kCertificate;
      } else if (key == "unix_uid") {
        if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
            value.get<int64_t>() > 0xFFFFFFFE) {
          return Bad(who, "\"unix_uid\" must be a uid");
        }
        uid = value.get<int64_t>();
        ++credentials;
        p.authenticated_by = AuthMethod::kUnixUid;
      } else {
        return Bad(who, absl::StrCat("unknown field \"", key, "\""));
      }
    }
    if (!has_role) return Bad(who, "needs a \"role\"");
    if (credentials != 1) {
      return Bad(who,
                 "needs exactly one of \"token\", \"token_sha256\", \"certificate\", "
                 "\"unix_uid\"");
    }
    if (p.tenant.empty()) {
      if (p.role != Role::kAdmin) return Bad(who, "a worker or reader needs a \"tenant\"");
      p.tenant = std::string(kAllNamespaces);
    }
    bool fresh = true;
    if (!token_digest.empty()) {
      fresh = table.by_token_digest_.emplace(token_digest, p).second;
    } else if (!certificate.empty()) {
      fresh = table.by_certificate_.emplace(certificate, p).second;
    } else {
      fresh = table.by_uid_.emplace(static_cast<uid_t>(uid), p).second;
    }
    if (!fresh) return Bad(who, "its credential is already another principal's");
    ++table.size_;
  }
  return table;
}

absl::StatusOr<PrincipalTable> LoadPrincipalsFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    std::string message =
        absl::StrCat("cannot read principals file ", path, ": ", std::strerror(err));
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::NotFoundError(message);
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<PrincipalTable> table = ParsePrincipals(text.str());
  if (!table.ok()) {
    return absl::Status(table.status().code(), absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

}  // namespace kvcache
