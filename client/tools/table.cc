#include "table.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace kvcache::ctl {

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> width(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    width[c] = columns_[c].header.size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto print_row = [&](auto cell) {
    std::string line;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const std::string& text = cell(c);
      const std::string pad(width[c] - text.size(), ' ');
      if (c > 0) line += "  ";
      line += columns_[c].numeric ? pad + text : text + pad;
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out << line << '\n';
  };
  print_row([&](size_t c) -> const std::string& { return columns_[c].header; });
  for (const auto& row : rows_) {
    print_row([&](size_t c) -> const std::string& { return row[c]; });
  }
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

}  // namespace kvcache::ctl
