#include "kvcache/kernels/gather.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvcache/kernels/quantize.h"
#include "test_util.h"

namespace kvcache::kernels {
namespace {

// dst[h][i] = src[h][kept[i]], row by row, the obvious way.
std::vector<uint8_t> NaiveGather(const std::vector<uint8_t>& src, size_t elem, int64_t heads,
                                 int64_t tokens, int64_t dim, const std::vector<int32_t>& kept) {
  const size_t row = static_cast<size_t>(dim) * elem;
  std::vector<uint8_t> out;
  for (int64_t h = 0; h < heads; ++h) {
    for (int32_t k : kept) {
      const uint8_t* r = src.data() + (static_cast<size_t>(h * tokens + k)) * row;
      out.insert(out.end(), r, r + row);
    }
  }
  return out;
}

TEST(GatherTest, CopiesKeptRowsInOrderForEveryDType) {
  const int64_t heads = 3, tokens = 20, dim = 12;
  const std::vector<std::vector<int32_t>> lists = {
      {},
      {0},
      {19},
      {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19},
      {0, 1, 2, 7, 8, 15, 19},
      {1, 3, 5, 7, 9, 11}};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8}) {
    const size_t elem = DTypeSize(dtype);
    std::vector<uint8_t> src(static_cast<size_t>(heads * tokens * dim) * elem);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
    for (const auto& kept : lists) {
      const int64_t num_kept = static_cast<int64_t>(kept.size());
      std::vector<uint8_t> dst(static_cast<size_t>(heads * num_kept * dim) * elem, 0xEE);
      ASSERT_EQ(
          GatherTokensCpu(src.data(), dtype, heads, tokens, dim, kept.data(), num_kept, dst.data()),
          KernelStatus::kOk);
      EXPECT_EQ(dst, NaiveGather(src, elem, heads, tokens, dim, kept))
          << DTypeName(dtype) << " kept " << num_kept;
    }
  }
}

TEST(GatherTest, CompactsPerTokenScalesWithHeadDimOne) {
  // Values quantized per token: codes and scales compact with the same index list.
  const int64_t heads = 2, tokens = 6, dim = 4;
  const std::vector<float> v = test::Gaussian(heads * tokens * dim, 8);
  std::vector<int8_t> codes(v.size());
  std::vector<float> scales(heads * tokens);
  ASSERT_EQ(QuantizeInt8Cpu(v.data(), DType::kFloat32, heads, tokens, dim, QuantAxis::kPerToken,
                            codes.data(), scales.data()),
            KernelStatus::kOk);
  const std::vector<int32_t> kept = {0, 2, 5};
  std::vector<int8_t> kept_codes(heads * 3 * dim);
  std::vector<float> kept_scales(heads * 3);
  ASSERT_EQ(GatherTokensCpu(codes.data(), DType::kInt8, heads, tokens, dim, kept.data(), 3,
                            kept_codes.data()),
            KernelStatus::kOk);
  ASSERT_EQ(GatherTokensCpu(scales.data(), DType::kFloat32, heads, tokens, 1, kept.data(), 3,
                            kept_scales.data()),
            KernelStatus::kOk);
  std::vector<float> restored(kept_codes.size());
  ASSERT_EQ(DequantizeInt8Cpu(kept_codes.data(), kept_scales.data(), heads, 3, dim,
                              QuantAxis::kPerToken, DType::kFloat32, restored.data()),
            KernelStatus::kOk);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t d = 0; d < dim; ++d) {
        const float original = v[(h * tokens + kept[i]) * dim + d];
        EXPECT_NEAR(restored[(h * 3 + i) * dim + d], original, 0.01f);
      }
    }
  }
}

TEST(GatherTest, RejectsBadIndexListsWithoutWriting) {
  const int64_t tokens = 8, dim = 2;
  std::vector<float> src(tokens * dim, 1.0f);
  std::vector<float> dst(tokens * dim, -3.0f);
  const std::vector<std::vector<int32_t>> bad = {{2, 1}, {1, 1}, {0, 8}, {-1, 3}};
  for (const auto& kept : bad) {
    EXPECT_EQ(GatherTokensCpu(src.data(), DType::kFloat32, 1, tokens, dim, kept.data(),
                              static_cast<int64_t>(kept.size()), dst.data()),
              KernelStatus::kInvalidArgument);
  }
  const std::vector<int32_t> ok = {0, 1};
  EXPECT_EQ(GatherTokensCpu(src.data(), DType::kFloat32, 1, tokens, dim, ok.data(), 9, dst.data()),
            KernelStatus::kInvalidArgument);  // num_kept > num_tokens.
  EXPECT_EQ(
      GatherTokensCpu(src.data(), static_cast<DType>(42), 1, tokens, dim, ok.data(), 2, dst.data()),
      KernelStatus::kInvalidArgument);
  EXPECT_EQ(GatherTokensCpu(src.data(), DType::kFloat32, 1, tokens, dim, nullptr, 2, dst.data()),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(dst, std::vector<float>(tokens * dim, -3.0f));
}

}  // namespace
}  // namespace kvcache::kernels
