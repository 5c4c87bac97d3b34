// Fuzz target: the principals file (server/security/principals_file.h), which
// decides who may call the daemon; a file an operator mistypes must be
// refused whole, never half-read into wider access.
//
// Input: the file's bytes, given to ParsePrincipals. Properties: it never
// crashes; it fails only with INVALID_ARGUMENT; a table it accepts has one
// entry per principal at most, and every tenant it lists is a valid
// namespace name.
#include <string_view>

#include "server/core/layout.h"
#include "server/security/principals_file.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvcache::PrincipalTable> table = kvcache::ParsePrincipals(text);
  if (!table.ok()) {
    FUZZ_CHECK(table.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(table->tenants().size() <= table->size());
  for (const std::string& tenant : table->tenants()) {
    FUZZ_CHECK(kvcache::ValidateIdentifier("tenant", tenant).ok());
  }
  return 0;
}
