#include "server/rpc/await_prefetches.h"

#include <atomic>
#include <utility>

namespace kvcache {
namespace {

struct Pending {
  explicit Pending(size_t tickets, std::function<void(bool)> a)
      : remaining(tickets), answer(std::move(a)) {}
  std::atomic<size_t> remaining;
  std::atomic<bool> answered{false};
  std::atomic<DeadlineTimer::Id> deadline{0};
  std::function<void(bool)> answer;
};

// The first caller answers; later ones (the other of ticket and deadline) do nothing.
void Answer(DeadlineTimer& timer, const std::shared_ptr<Pending>& pending, bool in_time) {
  if (pending->answered.exchange(true)) return;
  if (in_time) {
    if (const DeadlineTimer::Id id = pending->deadline.load(); id != 0) timer.Cancel(id);
  }
  std::function<void(bool)> answer = std::move(pending->answer);
  answer(in_time);
}

}  // namespace

void AwaitPrefetches(DeadlineTimer& timer, std::vector<std::shared_ptr<WorkTicket>> tickets,
                     absl::Duration timeout, std::function<void(bool in_time)> answer) {
  if (tickets.empty()) {
    answer(true);
    return;
  }
  auto pending = std::make_shared<Pending>(tickets.size(), std::move(answer));
  // The deadline first, so a ticket done at once can cancel it.
  if (timeout != absl::ZeroDuration()) {
    pending->deadline.store(timer.Schedule(
        absl::Now() + timeout, [&timer, pending] { Answer(timer, pending, /*in_time=*/false); }));
  }
  for (const std::shared_ptr<WorkTicket>& ticket : tickets) {
    ticket->OnDone([&timer, pending] {
      if (pending->remaining.fetch_sub(1) == 1) Answer(timer, pending, /*in_time=*/true);
    });
  }
}

}  // namespace kvcache
