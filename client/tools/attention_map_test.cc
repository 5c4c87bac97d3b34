// The attention map of kvcachectl attention: the SVG's cells and marks, and
// the span ranking.
#include "attention_map.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "png_writer.h"

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
    std::ofstream(std::string(dir) + "/attention_map.png", std::ios::binary)
        << AttentionPng(Response(true), {.tokens_per_row = 16});
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

// The PNG's chunks, checked with their CRCs, and its pixels, read back from
// the stored deflate blocks.
struct DecodedPng {
  uint32_t width = 0;
  uint32_t height = 0;
  std::string pixels;  // filter byte + RGB per row
};

uint32_t U32(const std::string& s, size_t at) {
  return uint32_t{static_cast<uint8_t>(s[at])} << 24 |
         uint32_t{static_cast<uint8_t>(s[at + 1])} << 16 |
         uint32_t{static_cast<uint8_t>(s[at + 2])} << 8 | static_cast<uint8_t>(s[at + 3]);
}

::testing::AssertionResult Decode(const std::string& png, DecodedPng* out) {
  if (png.rfind("\x89PNG\r\n\x1a\n", 0) != 0) return ::testing::AssertionFailure() << "signature";
  std::string idat;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t n = U32(png, at);
    const std::string typed = png.substr(at + 4, 4 + n);
    if (Crc32(typed) != U32(png, at + 8 + n)) {
      return ::testing::AssertionFailure() << "bad CRC in " << typed.substr(0, 4);
    }
    if (typed.substr(0, 4) == "IHDR") {
      out->width = U32(typed, 4);
      out->height = U32(typed, 8);
    }
    if (typed.substr(0, 4) == "IDAT") idat += typed.substr(4);
    at += 12 + n;
  }
  // zlib header, then stored blocks: BFINAL/BTYPE byte, LEN, NLEN, bytes.
  for (size_t at = 2; at + 5 <= idat.size();) {
    const size_t len = static_cast<uint8_t>(idat[at + 1]) | static_cast<uint8_t>(idat[at + 2]) << 8;
    const size_t nlen = static_cast<uint8_t>(idat[at + 3]) | static_cast<uint8_t>(idat[at + 4])
                                                                 << 8;
    if ((len ^ 0xffff) != nlen) return ::testing::AssertionFailure() << "LEN/NLEN";
    out->pixels += idat.substr(at + 5, len);
    const bool last = idat[at] & 1;
    at += 5 + len;
    if (last) break;
  }
  if (out->pixels.size() != size_t{out->height} * (out->width * 3 + 1)) {
    return ::testing::AssertionFailure() << "pixel bytes " << out->pixels.size();
  }
  return ::testing::AssertionSuccess();
}

TEST(AttentionMapTest, PngHasOneCellPerTokenInTheSameColours) {
  const std::string png = AttentionPng(Response(false), {.tokens_per_row = 16});
  DecodedPng d;
  ASSERT_TRUE(Decode(png, &d));
  EXPECT_EQ(d.width, 16u * 8 + 2);
  auto pixel = [&](int x, int y) {
    const size_t at = size_t(y) * (d.width * 3 + 1) + 1 + size_t(x) * 3;
    return uint32_t{static_cast<uint8_t>(d.pixels[at])} << 16 |
           uint32_t{static_cast<uint8_t>(d.pixels[at + 1])} << 8 |
           static_cast<uint8_t>(d.pixels[at + 2]);
  };
  // Token 0 is protected (a red frame); token 16 starts the brightest row;
  // its precision band is INT8's colour.
  EXPECT_EQ(pixel(1, 1), 0xd62828u);
  const uint32_t bright = pixel(1 + 3, 1 + 12 + 3);
  EXPECT_EQ(bright, 0xfde725u);                    // the ramp's top: importance 0.9 of max 0.9
  EXPECT_EQ(pixel(1 + 3, 1 + 12 + 8), 0xf4a261u);  // the INT8 band
  EXPECT_NE(pixel(1 + 3, 1 + 24 + 3), bright);     // the third row is dimmer
  // Large maps span several stored blocks.
  v1::InspectSequenceResponse big = Response(false);
  for (int t = 48; t < 4096; ++t) {
    big.add_importance(0.5f);
    big.add_precision(v1::STORED_PRECISION_FULL);
  }
  DecodedPng large;
  EXPECT_TRUE(Decode(AttentionPng(big, {}), &large));
  EXPECT_GT(large.pixels.size(), 65535u);
}

}  // namespace
}  // namespace kvcache::ctl
