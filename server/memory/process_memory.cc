#include "server/memory/process_memory.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvcache {
namespace {

// The value of "Name:\t<number>[ kB]" lines; false when `name` is absent or
// its value is not a number.
bool FindField(absl::string_view text, absl::string_view name, bool in_kib, uint64_t* out) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.size() <= name.size() || !absl::StartsWith(line, name) || line[name.size()] != ':') {
      continue;
    }
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(name.size() + 1));
    if (in_kib) {
      if (!absl::EndsWith(value, "kB")) return false;
      value = absl::StripAsciiWhitespace(value.substr(0, value.size() - 2));
    }
    uint64_t n = 0;
    if (!absl::SimpleAtoi(value, &n)) return false;
    *out = in_kib ? n << 10 : n;
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<ProcessMemory> ParseProcStatus(std::string_view text_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  ProcessMemory m;
  struct Field {
    absl::string_view name;
    uint64_t* out;
  };
  for (const Field& f :
       {Field{"VmRSS", &m.vm_rss_bytes}, Field{"RssAnon", &m.rss_anon_bytes},
        Field{"RssFile", &m.rss_file_bytes}, Field{"RssShmem", &m.rss_shmem_bytes}}) {
    if (!FindField(text, f.name, /*in_kib=*/true, f.out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("process status: no field ", f.name, " with a size in kB"));
    }
  }
  uint64_t threads = 0;
  if (!FindField(text, "Threads", /*in_kib=*/false, &threads)) {
    return absl::InvalidArgumentError("process status: no field Threads with a number");
  }
  m.threads = static_cast<uint32_t>(threads);
  return m;
}

absl::StatusOr<ProcessMemory> ReadProcessMemory() {
  std::ifstream in("/proc/self/status");
  if (!in) return absl::UnavailableError("cannot read /proc/self/status");
  std::stringstream text;
  text << in.rdbuf();
  return ParseProcStatus(text.str());
}

}  // namespace kvcache
