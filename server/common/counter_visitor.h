// CounterVisitor: how the core reports its counters without linking a
// metrics library (CacheLib's CounterVisitor is the model). A stats snapshot
// walks its counters and calls Visit once per sample; the metrics module
// groups the calls into Prometheus families, a test can record them.
//
// A family is a CounterFamily: the full metric name ("kvcached_tier_blocks"),
// its help text and its type. Each is a constant written once, next to the
// code that visits it, so every sample of one name carries the same help and
// type. The samples of a family differ in their label values; they carry the
// same label names in the same order (none for a family of one sample).
//
// Names, help and labels are views: valid only during the call. A visitor
// that keeps them copies them. A visitor is used by one thread at a time.
#ifndef KVCACHE_SERVER_COMMON_COUNTER_VISITOR_H_
#define KVCACHE_SERVER_COMMON_COUNTER_VISITOR_H_

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>

namespace kvcache {

enum class CounterType : uint8_t {
  kCounter,  // only grows while the daemon runs ("_total" names)
  kGauge,    // a value now
};

struct CounterFamily {
  std::string_view name;  // the full metric name
  std::string_view help;
  CounterType type = CounterType::kCounter;
};

struct CounterLabel {
  std::string_view name;
  std::string_view value;
};

class CounterVisitor {
 public:
  virtual ~CounterVisitor() = default;

  // One sample of `family`.
  void Visit(const CounterFamily& family, std::span<const CounterLabel> labels, double value) {
    OnSample(family, labels, value);
  }
  void Visit(const CounterFamily& family, std::initializer_list<CounterLabel> labels,
             double value) {
    OnSample(family, std::span<const CounterLabel>(labels.begin(), labels.size()), value);
  }
  void Visit(const CounterFamily& family, double value) { OnSample(family, {}, value); }

  // Names `family` without a sample: a family listed even when it has
  // nothing to report now (the per-model families before any model is
  // registered). Visitors that only count samples ignore it.
  void Declare(const CounterFamily& family) { OnDeclare(family); }

 private:
  virtual void OnSample(const CounterFamily& family, std::span<const CounterLabel> labels,
                        double value) = 0;
  virtual void OnDeclare(const CounterFamily& /*family*/) {}
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_COMMON_COUNTER_VISITOR_H_
