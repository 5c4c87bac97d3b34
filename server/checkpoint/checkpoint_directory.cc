#include "server/checkpoint/checkpoint_directory.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_files.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpoint_reader.h"
#include "server/common/status_macros.h"

namespace kvcache::checkpoint {

absl::string_view CheckpointStateName(CheckpointState state) {
  switch (state) {
    case CheckpointState::kComplete:
      return "complete";
    case CheckpointState::kIncomplete:
      return "incomplete";
    case CheckpointState::kCorrupt:
      return "corrupt";
    case CheckpointState::kUnsupported:
      return "unsupported";
  }
  return "unknown";
}

namespace {

struct FilesOf {
  bool data = false;
  bool manifest = false;
  bool manifest_temp = false;
};

// The checkpoint files in `dir` by sequence; empty when `dir` is missing.
absl::StatusOr<std::map<uint64_t, FilesOf>> Scan(FileSystem* fs, const std::string& dir) {
  std::map<uint64_t, FilesOf> files;
  absl::StatusOr<std::vector<std::string>> names = fs->ListDir(dir);
  if (!names.ok()) {
    if (absl::IsNotFound(names.status())) return files;
    return names.status();
  }
  for (const std::string& name : *names) {
    const std::optional<ParsedName> parsed = ParseFileName(name);
    if (!parsed) continue;
    FilesOf& f = files[parsed->sequence];
    switch (parsed->kind) {
      case ParsedName::Kind::kData:
        f.data = true;
        break;
      case ParsedName::Kind::kManifest:
        f.manifest = true;
        break;
      case ParsedName::Kind::kManifestTemp:
        f.manifest_temp = true;
        break;
    }
  }
  return files;
}

CheckpointInfo InfoFrom(const Manifest& m) {
  return CheckpointInfo{m.sequence,
                        CheckpointState::kComplete,
                        "",
                        m.created_unix_ms,
                        m.write_duration_ms,
                        m.data_bytes,
                        m.record_count,
                        m.summary,
                        m.references};
}

}  // namespace

absl::StatusOr<std::vector<CheckpointInfo>> CheckpointDirectory::List() const {
  absl::StatusOr<std::map<uint64_t, FilesOf>> files = Scan(fs_, dir_);
  if (!files.ok()) return files.status();
  std::map<uint64_t, CheckpointInfo> infos;
  for (const auto& [sequence, f] : *files) {
    CheckpointInfo info;
    info.sequence = sequence;
    if (!f.manifest) {
      info.state = CheckpointState::kIncomplete;
      info.reason = f.data ? "data file without a manifest (the writer did not commit)"
                           : "manifest.tmp without a manifest (the writer did not commit)";
      infos.emplace(sequence, std::move(info));
      continue;
    }
    absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpointFiles(fs_, dir_, sequence, mac_key_);
    if (opened.ok()) {
      info = InfoFrom(opened->manifest);
    } else if (absl::IsFailedPrecondition(opened.status())) {
      info.state = CheckpointState::kUnsupported;
      info.reason = std::string(opened.status().message());
    } else if (absl::IsDataLoss(opened.status())) {
      info.state = CheckpointState::kCorrupt;
      info.reason = std::string(opened.status().message());
    } else {
      return opened.status();  // an I/O error says nothing about the checkpoint
    }
    infos.emplace(sequence, std::move(info));
  }
  // A checkpoint is complete only if what it references is (ascending order
  // settles chains that point backwards; repeat until nothing changes).
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& [sequence, info] : infos) {
      if (info.state != CheckpointState::kComplete) continue;
      for (uint64_t ref : info.references) {
        const auto it = infos.find(ref);
        if (it == infos.end() || it->second.state != CheckpointState::kComplete) {
          info.state = CheckpointState::kCorrupt;
          info.reason =
              absl::StrCat("references checkpoint ", ref, ", which is ",
                           it == infos.end() ? "missing" : CheckpointStateName(it->second.state));
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<CheckpointInfo> out;
  out.reserve(infos.size());
  for (auto& [sequence, info] : infos) out.push_back(std::move(info));
  return out;
}

absl::StatusOr<CheckpointInfo> CheckpointDirectory::NewestComplete() const {
  absl::StatusOr<std::vector<CheckpointInfo>> infos = List();
  if (!infos.ok()) return infos.status();
  for (auto it = infos->rbegin(); it != infos->rend(); ++it) {
    if (it->state == CheckpointState::kComplete) return *it;
  }
  return absl::NotFoundError(absl::StrCat("no complete checkpoint in ", dir_));
}

absl::StatusOr<uint64_t> CheckpointDirectory::NextSequence() const {
  absl::StatusOr<std::map<uint64_t, FilesOf>> files = Scan(fs_, dir_);
  if (!files.ok()) return files.status();
  return files->empty() ? 1 : files->rbegin()->first + 1;
}

absl::StatusOr<VerifyReport> CheckpointDirectory::Verify(uint64_t sequence) const {
  VerifyReport report;
  report.sequence = sequence;
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(fs_, dir_, sequence, {.mac_key = mac_key_});
  if (!reader.ok()) {
    report.status = reader.status();
    return report;
  }
  report.data_bytes = (*reader)->info().data_bytes;
  for (uint64_t ref : (*reader)->info().references) {
    absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpointFiles(fs_, dir_, ref, mac_key_);
    if (!opened.ok()) {
      report.status =
          absl::DataLossError(absl::StrCat("checkpoint ", sequence, " references checkpoint ", ref,
                                           ": ", opened.status().message()));
      return report;
    }
  }
  Record record;
  while (true) {
    absl::StatusOr<bool> more = (*reader)->Next(&record);
    if (!more.ok()) {
      report.status = more.status();
      break;
    }
    if (!*more) break;
    ++report.records_read;
    report.record_bytes += record.bytes.size();
  }
  return report;
}

absl::Status CheckpointDirectory::DeleteCheckpoint(uint64_t sequence) const {
  // The manifest first: a crash part way leaves an incomplete leftover, never
  // a manifest without its data.
  for (const std::string& name :
       {ManifestFileName(sequence), DataFileName(sequence), ManifestTempFileName(sequence)}) {
    absl::Status s = fs_->Delete(JoinPath(dir_, name));
    if (!s.ok() && !absl::IsNotFound(s)) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<PruneReport> CheckpointDirectory::Prune(uint32_t keep) const {
  if (keep == 0) return absl::InvalidArgumentError("Prune: keep must be at least 1");
  absl::StatusOr<std::vector<CheckpointInfo>> infos = List();
  if (!infos.ok()) return infos.status();
  std::map<uint64_t, const CheckpointInfo*> by_sequence;
  for (const CheckpointInfo& info : *infos) by_sequence[info.sequence] = &info;
  std::set<uint64_t> kept;
  std::vector<uint64_t> pending;
  for (auto it = infos->rbegin(); it != infos->rend() && pending.size() < keep; ++it) {
    if (it->state == CheckpointState::kComplete) pending.push_back(it->sequence);
  }
  while (!pending.empty()) {
    const uint64_t sequence = pending.back();
    pending.pop_back();
    if (!kept.insert(sequence).second) continue;
    const auto it = by_sequence.find(sequence);
    if (it == by_sequence.end()) continue;
    for (uint64_t ref : it->second->references) pending.push_back(ref);
  }
  PruneReport report;
  for (const CheckpointInfo& info : *infos) {
    if (kept.contains(info.sequence)) {
      report.kept.push_back(info.sequence);
    } else if (info.state != CheckpointState::kUnsupported) {
      KVCACHE_RETURN_IF_ERROR(DeleteCheckpoint(info.sequence));
      report.deleted.push_back(info.sequence);
    }
  }
  if (!report.deleted.empty()) {
    KVCACHE_RETURN_IF_ERROR(fs_->SyncDir(dir_));
  }
  return report;
}

}  // namespace kvcache::checkpoint
