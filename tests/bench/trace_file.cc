#include "trace_file.h"

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvcache::bench {
namespace {

// Reads the unsigned integer after `"key":` in `line`.
bool ReadUint(const std::string& line, const std::string& key, uint64_t* value) {
  size_t p = line.find("\"" + key + "\"");
  if (p == std::string::npos) return false;
  p = line.find(':', p);
  if (p == std::string::npos) return false;
  ++p;
  while (p < line.size() && line[p] == ' ') ++p;
  size_t e = p;
  while (e < line.size() && line[e] >= '0' && line[e] <= '9') ++e;
  return absl::SimpleAtoi(absl::string_view(line.data() + p, e - p), value);
}

}  // namespace

absl::StatusOr<TraceRequest> ParseTraceLine(const std::string& line) {
  TraceRequest r;
  if (!ReadUint(line, "timestamp", &r.timestamp_ms)) r.timestamp_ms = 0;
  if (!ReadUint(line, "input_length", &r.input_length)) {
    return absl::InvalidArgumentError("no \"input_length\"");
  }
  size_t p = line.find("\"hash_ids\"");
  if (p == std::string::npos) return absl::InvalidArgumentError("no \"hash_ids\"");
  p = line.find('[', p);
  const size_t end = p == std::string::npos ? p : line.find(']', p);
  if (end == std::string::npos) return absl::InvalidArgumentError("\"hash_ids\" is not a list");
  for (size_t i = p + 1; i < end;) {
    while (i < end && (line[i] == ' ' || line[i] == ',')) ++i;
    size_t j = i;
    while (j < end && line[j] >= '0' && line[j] <= '9') ++j;
    if (j == i) {
      if (i < end) return absl::InvalidArgumentError("bad number in \"hash_ids\"");
      break;
    }
    uint64_t id;
    if (!absl::SimpleAtoi(absl::string_view(line.data() + i, j - i), &id)) {
      return absl::InvalidArgumentError("bad number in \"hash_ids\"");
    }
    r.hash_ids.push_back(id);
    i = j;
  }
  return r;
}

absl::StatusOr<std::vector<TraceRequest>> LoadTrace(const std::string& path, uint64_t limit) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace '", path, "'"));
  std::vector<TraceRequest> reqs;
  std::string line;
  for (uint64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    absl::StatusOr<TraceRequest> r = ParseTraceLine(line);
    if (!r.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": ", r.status().message()));
    }
    reqs.push_back(*std::move(r));
    if (limit != 0 && reqs.size() >= limit) break;
  }
  return reqs;
}

}  // namespace kvcache::bench
