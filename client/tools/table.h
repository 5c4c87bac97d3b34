// Small text helpers for kvcachectl: aligned tables and human-readable sizes.
#ifndef KVCACHE_CLIENT_TOOLS_TABLE_H_
#define KVCACHE_CLIENT_TOOLS_TABLE_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace kvcache::ctl {

// A table printed with every column as wide as its widest cell, two spaces
// apart; columns marked numeric are right-aligned. Not thread-safe.
class Table {
 public:
  struct Column {
    std::string header;
    bool numeric = false;
  };
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

  // REQUIRES: cells.size() == number of columns.
  void AddRow(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }
  void Print(std::ostream& out) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// "512 B", "1.5 KiB", "64.0 MiB", ...
std::string HumanBytes(uint64_t bytes);
// "12.5%" of part/whole, "-" when whole is 0.
std::string Percent(uint64_t part, uint64_t whole);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CLIENT_TOOLS_TABLE_H_
