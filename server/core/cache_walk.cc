// Cache: walks of whole indexes in bounded steps (Cache::WalkModel).
#include <chrono>
#include <memory>
#include <thread>

#include "server/core/cache.h"

namespace kvcache {

bool Cache::WalkModel(const ModelKey& model, const WalkScope& scope,
                      absl::FunctionRef<void(const ModelState&, IndexNode*)> visit) const {
  // The cursor is created, stepped and destroyed under the lock only; the
  // index tells it of every removal in between, and detaches it when the
  // model goes.
  std::unique_ptr<PrefixIndex::Cursor> cursor;
  {
    WriteLock lock(this);
    const ModelState* m = models_.Find(model);
    if (m == nullptr) return false;
    const IndexNode* top = nullptr;
    if (scope.top_lookup_hash.has_value()) {
      top = m->index.FindByLookupHash(*scope.top_lookup_hash);
      if (top == nullptr) return false;
    }
    cursor = std::make_unique<PrefixIndex::Cursor>(&m->index, top, scope.max_depth);
  }
  while (true) {
    const auto start = std::chrono::steady_clock::now();
    {
      WriteLock lock(this);
      const ModelState* m = models_.Find(model);
      // Gone, or registered anew (a new index): the walk ends short.
      if (m == nullptr || cursor->index() != &m->index) {
        cursor.reset();
        return false;
      }
      cursor->Step(kWalkStepNodes, [&](IndexNode* n) { visit(*m, n); });
      if (cursor->done()) {
        cursor.reset();
        return true;
      }
    }
    GiveWayAfterStep(start);
  }
}

void Cache::GiveWayAfterStep(std::chrono::steady_clock::time_point step_start) {
  std::this_thread::sleep_for(std::chrono::steady_clock::now() - step_start);
}

}  // namespace kvcache
