// Sealed values and store keys: what a Redis operator or a network observer
// can do to them (read, change, cut, swap, replay elsewhere) gets nothing
// and opens nothing.
#include "server/remote/value_seal.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "server/remote/remote_key.h"
#include "server/remote/remote_test_util.h"

namespace kvcache {
namespace {

using remote_test::Secret;

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return v;
}

TEST(ValueSealTest, OpensWhatItSealedAndHidesIt) {
  const ValueSealer sealer(Secret(1));
  for (size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{2} << 20}) {
    const std::vector<std::byte> plain = Bytes(n, 7);
    std::string sealed = "prefix";  // Seal appends
    sealer.Seal("tenant-a", "kvc:00", plain, &sealed);
    ASSERT_EQ(sealed.size(), 6 + n + ValueSealer::kOverheadBytes);
    std::string_view value(sealed);
    value.remove_prefix(6);
    if (n >= 64) {
      // The plaintext does not appear in the value.
      EXPECT_EQ(value.find(std::string_view(reinterpret_cast<const char*>(plain.data()), 64)),
                std::string_view::npos);
    }
    std::vector<std::byte> opened(ValueSealer::OpenedBytes(value.size()));
    ASSERT_TRUE(sealer.Open("tenant-a", "kvc:00", value, opened).ok()) << n;
    EXPECT_EQ(opened, plain);
  }
}

TEST(ValueSealTest, PeekGivesThePlaintextsFirstBytesAndOpenStillJudges) {
  const ValueSealer sealer(Secret(1));
  const std::vector<std::byte> plain = Bytes(4096, 9);
  std::string sealed;
  sealer.Seal("tenant-a", "kvc:01", plain, &sealed);
  std::vector<std::byte> head(16);
  ASSERT_TRUE(sealer.Peek("tenant-a", "kvc:01", sealed, head).ok());
  EXPECT_TRUE(std::equal(head.begin(), head.end(), plain.begin()));
  // A byte changed past the header: Peek cannot tell (it authenticates
  // nothing); Open refuses the value.
  sealed[sealed.size() / 2] ^= 1;
  ASSERT_TRUE(sealer.Peek("tenant-a", "kvc:01", sealed, head).ok());
  EXPECT_TRUE(std::equal(head.begin(), head.end(), plain.begin()));
  std::vector<std::byte> opened(plain.size());
  EXPECT_EQ(sealer.Open("tenant-a", "kvc:01", sealed, opened).code(), absl::StatusCode::kDataLoss);
  // Too short for the header asked, or of another version: refused.
  EXPECT_EQ(sealer.Peek("tenant-a", "kvc:01", sealed.substr(0, 40), head).code(),
            absl::StatusCode::kDataLoss);
  sealed[0] ^= 0x7f;
  EXPECT_EQ(sealer.Peek("tenant-a", "kvc:01", sealed, head).code(), absl::StatusCode::kDataLoss);
}

TEST(ValueSealTest, PiecesSealAndOpenAsTheirJoinedBytes) {
  const ValueSealer sealer(Secret(1));
  const std::vector<std::byte> plain = Bytes(1000, 5);
  const std::span<const std::byte> whole(plain);
  const std::span<const std::byte> in[] = {whole.first(16), whole.subspan(16, 0),
                                           whole.subspan(16)};
  std::string sealed;
  sealer.Seal("ns", "k", in, &sealed);
  // Opens whole, and into pieces of other sizes.
  std::vector<std::byte> joined(plain.size());
  ASSERT_TRUE(sealer.Open("ns", "k", sealed, joined).ok());
  EXPECT_EQ(joined, plain);
  std::vector<std::byte> a(999), b(1);
  const std::span<std::byte> out[] = {a, b};
  ASSERT_TRUE(sealer.Open("ns", "k", sealed, out).ok());
  a.push_back(b[0]);
  EXPECT_EQ(a, plain);
  std::vector<std::byte> small(10);
  const std::span<std::byte> too_small[] = {small};
  EXPECT_EQ(sealer.Open("ns", "k", sealed, too_small).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValueSealTest, TheSameValueSealsDifferentlyEachTime) {
  const ValueSealer sealer(Secret(1));
  const std::vector<std::byte> plain = Bytes(256, 3);
  std::string a, b;
  sealer.Seal("ns", "k", plain, &a);
  sealer.Seal("ns", "k", plain, &b);
  EXPECT_NE(a, b);
}

TEST(ValueSealTest, AnyChangedByteOrCutOrSwapIsRefused) {
  const ValueSealer sealer(Secret(1));
  const std::vector<std::byte> plain = Bytes(100, 9);
  std::string sealed;
  sealer.Seal("ns", "kvc:01", plain, &sealed);
  std::vector<std::byte> out(plain.size());
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::string changed = sealed;
    changed[i] = static_cast<char>(changed[i] ^ 0x01);
    EXPECT_EQ(sealer.Open("ns", "kvc:01", changed, out).code(), absl::StatusCode::kDataLoss) << i;
  }
  // Another key, namespace or secret: the value was not sealed for it.
  EXPECT_EQ(sealer.Open("ns", "kvc:02", sealed, out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(sealer.Open("other", "kvc:01", sealed, out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ValueSealer(Secret(2)).Open("ns", "kvc:01", sealed, out).code(),
            absl::StatusCode::kDataLoss);
  // Cut short, or nothing like a sealed value.
  std::vector<std::byte> shorter(plain.size() - 1);
  EXPECT_EQ(sealer.Open("ns", "kvc:01", sealed.substr(0, sealed.size() - 1), shorter).code(),
            absl::StatusCode::kDataLoss);
  std::vector<std::byte> none;
  EXPECT_EQ(sealer.Open("ns", "kvc:01", "tiny", none).code(), absl::StatusCode::kDataLoss);
  // The right value with a destination of the wrong size.
  std::vector<std::byte> wrong(plain.size() + 1);
  EXPECT_EQ(sealer.Open("ns", "kvc:01", sealed, wrong).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(sealer.Open("ns", "kvc:01", sealed, out).ok());
}

const ModelLayout kLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_tokens = 4};

TEST(RemoteKeyTest, KeysChainEveryTokenBeforeThem) {
  const RemoteKeyChain chain(Secret(1), {"ns", "m"}, kLayout);
  const std::vector<Token> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<std::string> keys = chain.KeysOf(a);
  ASSERT_EQ(keys.size(), 2u);  // the partial third block has none
  EXPECT_EQ(keys[0].size(), 4 + 32u);
  EXPECT_TRUE(keys[0].starts_with("kvc:"));
  EXPECT_NE(keys[0], keys[1]);
  EXPECT_EQ(chain.KeysOf(a), keys);  // deterministic
  // Another daemon with the same secret names the blocks the same way.
  EXPECT_EQ(RemoteKeyChain(Secret(1), {"ns", "m"}, kLayout).KeysOf(a), keys);
  // The same second block after another first block is another key.
  std::vector<Token> b = a;
  b[0] = 99;
  std::vector<std::string> other = chain.KeysOf(b);
  EXPECT_NE(other[0], keys[0]);
  EXPECT_NE(other[1], keys[1]);
  // A prefix's keys are the first keys of the whole.
  EXPECT_EQ(chain.KeysOf(std::span<const Token>(a).first(4)), std::vector<std::string>{keys[0]});
}

TEST(RemoteKeyTest, NamespacesModelsLayoutsAndSecretsNameBlocksApart) {
  const std::vector<Token> tokens = {1, 2, 3, 4};
  ModelLayout bf16 = kLayout;
  bf16.dtype = DType::kBf16;
  std::set<std::string> keys = {
      RemoteKeyChain(Secret(1), {"ns", "m"}, kLayout).KeysOf(tokens)[0],
      RemoteKeyChain(Secret(1), {"other", "m"}, kLayout).KeysOf(tokens)[0],
      RemoteKeyChain(Secret(1), {"ns", "m2"}, kLayout).KeysOf(tokens)[0],
      RemoteKeyChain(Secret(1), {"ns", "m"}, bf16).KeysOf(tokens)[0],
      RemoteKeyChain(Secret(2), {"ns", "m"}, kLayout).KeysOf(tokens)[0],
      // The separators keep ("ab", "c") apart from ("a", "bc").
      RemoteKeyChain(Secret(1), {"ab", "c"}, kLayout).KeysOf(tokens)[0],
      RemoteKeyChain(Secret(1), {"a", "bc"}, kLayout).KeysOf(tokens)[0],
  };
  EXPECT_EQ(keys.size(), 7u);
}

}  // namespace
}  // namespace kvcache
