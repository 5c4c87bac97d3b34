// The attention map of kvcachectl attention: the SVG's cells and marks, and
// the span ranking.
#include "attention_map.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace kvcache::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// 48 tokens of 2 layers x 2 heads: importance rises to a peak on 16..31.
v1::InspectSequenceResponse Response(bool with_heads) {
  v1::InspectSequenceResponse r;
  r.mutable_layout()->set_num_layers(2);
  r.mutable_layout()->set_num_kv_heads(2);
  r.set_matched_tokens(48);
  for (int t = 0; t < 48; ++t) {
    const float v = t >= 16 && t < 32 ? 0.9f : 0.1f + 0.001f * t;
    r.add_importance(v);
    r.add_activity(v / 2);
    r.add_pinned(t == 40);
    r.add_is_protected(t < 4 || t == 40);
    r.add_precision(
        t < 4 ? v1::STORED_PRECISION_FULL
              : (t >= 16 && t < 32 ? v1::STORED_PRECISION_INT8 : v1::STORED_PRECISION_INT4));
    r.add_tokens(1000 + t);
  }
  for (int b = 0; b < 3; ++b) r.add_blocks()->set_index(b);
  if (with_heads) {
    std::vector<float> heads(2 * 2 * 48, 0.0f);
    for (int t = 0; t < 48; ++t) heads[t] = 1.0f;  // layer 0 head 0
    r.set_head_activity(
        std::string(reinterpret_cast<const char*>(heads.data()), heads.size() * sizeof(float)));
  }
  return r;
}

TEST(AttentionMapTest, OneCellAndOneStripePerTokenWithMarks) {
  const std::string svg =
      AttentionSvg(Response(false), {.title = "m <&> \"x\"", .tokens_per_row = 16});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(Count(svg, "class=\"token\""), 48);
  EXPECT_EQ(Count(svg, "class=\"precision\""), 48);
  EXPECT_EQ(Count(svg, "stroke=\"#d62828\""), 5);                // 4 sinks and the pinned token
  EXPECT_EQ(Count(svg, "stroke-dasharray"), 1);                  // pinned
  EXPECT_THAT(svg, HasSubstr("m &lt;&amp;&gt; &quot;x&quot;"));  // escaped title
  EXPECT_THAT(svg, Not(HasSubstr("token 1000")));                // no token ids unless asked
  EXPECT_THAT(svg, HasSubstr("averaged over layers"));
  if (const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    std::ofstream(std::string(dir) + "/attention_map.svg") << svg;
  }
}

TEST(AttentionMapTest, PerLayerRowsWhenTheResponseHasHeadActivity) {
  const v1::InspectSequenceResponse r = Response(true);
  const std::vector<std::vector<float>> layers = LayerActivity(r);
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_FLOAT_EQ(layers[0][7], 0.5f);  // mean of head 0 (1) and head 1 (0)
  EXPECT_FLOAT_EQ(layers[1][7], 0.0f);
  const std::string svg = AttentionSvg(r, {.label_tokens = true});
  EXPECT_THAT(svg, HasSubstr(">L0<"));
  EXPECT_THAT(svg, HasSubstr(">L1<"));
  EXPECT_THAT(svg, HasSubstr("token 1000"));
  // A head map of the wrong size is ignored, not read past its end.
  v1::InspectSequenceResponse short_map = r;
  short_map.mutable_head_activity()->resize(10);
  EXPECT_TRUE(LayerActivity(short_map).empty());
}

TEST(AttentionMapTest, SpansRankByMeanImportance) {
  const SpanRanking spans = ImportantSpans(Response(false), 16, 2);
  ASSERT_EQ(spans.most.size(), 2u);
  EXPECT_EQ(spans.most[0].begin, 16u);
  EXPECT_EQ(spans.most[0].end, 32u);
  EXPECT_NEAR(spans.most[0].mean_importance, 0.9, 1e-6);
  EXPECT_EQ(spans.most[0].reduced_tokens, 16u);
  ASSERT_EQ(spans.least.size(), 2u);
  EXPECT_EQ(spans.least[0].begin, 0u);
  EXPECT_EQ(spans.least[0].protected_tokens, 4u);
  // A last span shorter than the others.
  const SpanRanking odd = ImportantSpans(Response(false), 20, 5);
  ASSERT_EQ(odd.most.size(), 3u);
  uint64_t covered = 0;
  for (const TokenSpan& s : odd.most) covered += s.end - s.begin;
  EXPECT_EQ(covered, 48u);
}

}  // namespace
}  // namespace kvcache::ctl
