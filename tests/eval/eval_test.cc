// Unit tests of kvcache-eval's parts: the safetensors KV-dump loader (a good
// file round-trips; truncated files, bad dtypes, bad shapes and offsets out
// of range are refused with a message naming the fault), the synthetic
// generator's statistics, byte accounting and budget adherence.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tests/eval/accounting.h"
#include "tests/eval/attention_pass.h"
#include "tests/eval/generator.h"
#include "tests/eval/importance_policy.h"
#include "tests/eval/metrics.h"
#include "tests/eval/mini_json.h"
#include "tests/eval/policies.h"
#include "tests/eval/safetensors.h"
#include "tests/eval/statistics.h"

namespace kvcache::eval {
namespace {

using ::testing::HasSubstr;

// Half the default model and context: large enough for the pooled
// statistics to be stable, about a second in an optimised build.
GeneratorConfig SmallConfig() {
  GeneratorConfig c;
  c.layers = 4;
  c.context = 1024;
  c.future = 64;
  return c;
}

KvDataset TinyDataset() {
  GeneratorConfig c = SmallConfig();
  c.layers = 2;
  c.q_heads = 4;
  c.context = 40;
  c.future = 8;
  c.head_dim = 32;
  c.outlier_channels = 2;
  c.duplicate_min = 2;
  c.duplicate_max = 4;
  absl::StatusOr<KvDataset> d = Generate(c);
  EXPECT_TRUE(d.ok()) << d.status();
  return *d;
}

// A hand-written single-layer dump: q/k/v [1, 2, 2] F32 and positions [2] I64.
std::string Header(const std::string& q_dtype = "F32", const std::string& k_shape = "[1,2,2]",
                   const std::string& k_offsets = "[16,32]") {
  return absl::StrCat(
      "{\"layer0.q\":{\"dtype\":\"", q_dtype, "\",\"shape\":[1,2,2],\"data_offsets\":[0,16]},",
      "\"layer0.k\":{\"dtype\":\"F32\",\"shape\":", k_shape, ",\"data_offsets\":", k_offsets, "},",
      "\"layer0.v\":{\"dtype\":\"F32\",\"shape\":[1,2,2],\"data_offsets\":[32,48]},",
      "\"positions\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[48,64]}}");
}

std::string Body() {
  std::string body(64, '\0');
  const float values[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::memcpy(body.data(), values, sizeof(values));
  const int64_t pos[2] = {0, 1};
  std::memcpy(body.data() + 48, pos, sizeof(pos));
  return body;
}

absl::Status LoadBytes(std::string bytes) {
  absl::StatusOr<SafetensorsFile> f = ParseSafetensors(std::move(bytes));
  if (!f.ok()) return f.status();
  return DatasetFromSafetensors(*f).status();
}

TEST(MiniJson, ParsesNestedValuesAndEscapes) {
  absl::StatusOr<JsonValue> v = ParseJson(
      R"({"a":[1,2.5,-3,true,null],"s":"x\"\u00e9\ud83d\ude00","big":18446744073709551615})");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_NE(v->Find("a"), nullptr);
  EXPECT_EQ(v->Find("a")->array.size(), 5u);
  EXPECT_TRUE(v->Find("a")->array[0].is_uint);
  EXPECT_FALSE(v->Find("a")->array[1].is_uint);
  EXPECT_FALSE(v->Find("a")->array[2].is_uint);
  EXPECT_EQ(v->Find("s")->string, "x\"\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v->Find("big")->uint_value, UINT64_MAX);
}

TEST(MiniJson, RejectsMalformedInput) {
  EXPECT_FALSE(ParseJson("{\"a\":1,}").ok());
  EXPECT_FALSE(ParseJson("{\"a\":1,\"a\":2}").ok());
  EXPECT_FALSE(ParseJson("[01]").ok());
  EXPECT_FALSE(ParseJson("\"\\ud800\"").ok());
  EXPECT_FALSE(ParseJson("{} x").ok());
  EXPECT_FALSE(ParseJson(std::string(100, '[') + std::string(100, ']')).ok());
}

TEST(Safetensors, GoodFileRoundTripsExactly) {
  const KvDataset d = TinyDataset();
  for (kernels::DType dtype : {kernels::DType::kFloat16, kernels::DType::kFloat32}) {
    absl::StatusOr<std::string> bytes = EncodeKvDump(d, dtype);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    absl::StatusOr<SafetensorsFile> f = ParseSafetensors(*bytes);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->data_start % 8, 0u);
    absl::StatusOr<KvDataset> back = DatasetFromSafetensors(*f);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->shape.layers, d.shape.layers);
    EXPECT_EQ(back->shape.q_heads, d.shape.q_heads);
    EXPECT_EQ(back->shape.kv_heads, d.shape.kv_heads);
    EXPECT_EQ(back->shape.tokens, d.shape.tokens);
    // The generator rounds to fp16, so both dtypes are exact.
    EXPECT_EQ(back->q, d.q);
    EXPECT_EQ(back->k, d.k);
    EXPECT_EQ(back->v, d.v);
  }
}

TEST(Safetensors, HandWrittenFileLoads) {
  absl::StatusOr<SafetensorsFile> f = ParseSafetensors(FrameSafetensors(Header(), Body()));
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<KvDataset> d = DatasetFromSafetensors(*f);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->k[0], (std::vector<float>{5, 6, 7, 8}));
}

TEST(Safetensors, TruncatedFilesAreRefused) {
  const std::string good = FrameSafetensors(Header(), Body());
  // Inside the data: the last tensors' offsets now run past the buffer.
  absl::Status s = LoadBytes(good.substr(0, good.size() - 10));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("out of range"));
  EXPECT_THAT(s.message(), HasSubstr("positions"));
  // Inside the header.
  s = LoadBytes(good.substr(0, 40));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
  // Not even the length.
  EXPECT_EQ(LoadBytes("abc").code(), absl::StatusCode::kDataLoss);
  // Truncated JSON inside a consistent frame.
  std::string h = Header();
  EXPECT_THAT(LoadBytes(FrameSafetensors(h.substr(0, h.size() - 2), Body())).message(),
              HasSubstr("JSON"));
}

TEST(Safetensors, BadDTypesAreRefused) {
  absl::Status s = LoadBytes(FrameSafetensors(Header("F17"), Body()));
  EXPECT_THAT(s.message(), HasSubstr("unknown dtype \"F17\""));
  // A known dtype of the right size that the schema does not allow for q.
  s = LoadBytes(FrameSafetensors(Header("I32"), Body()));
  EXPECT_THAT(s.message(), HasSubstr("'layer0.q' has dtype I32"));
  const std::string bad_pos =
      absl::StrReplaceAll(Header(), {{"\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[48,64]",
                                      "\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[48,64]"}});
  EXPECT_THAT(LoadBytes(FrameSafetensors(bad_pos, Body())).message(),
              HasSubstr("'positions' has dtype F64"));
}

TEST(Safetensors, BadShapesAreRefused) {
  // Shape disagrees with the byte span.
  absl::Status s = LoadBytes(FrameSafetensors(Header("F32", "[1,2,3]"), Body()));
  EXPECT_THAT(s.message(), HasSubstr("'layer0.k': shape [1, 2, 3] of F32 is 24 bytes"));
  // Same size, wrong layout: k [2, 1, 2] vs v [1, 2, 2].
  s = LoadBytes(FrameSafetensors(Header("F32", "[2,1,2]"), Body()));
  EXPECT_THAT(s.message(), HasSubstr("must match"));
  // Rank 2.
  s = LoadBytes(FrameSafetensors(Header("F32", "[2,2]"), Body()));
  EXPECT_THAT(s.message(), HasSubstr("expected [heads, tokens, head_dim]"));
  // Negative dimension.
  s = LoadBytes(FrameSafetensors(Header("F32", "[1,-2,2]"), Body()));
  EXPECT_THAT(s.message(), HasSubstr("shape[1] is not a non-negative integer"));
}

TEST(Safetensors, OffsetsOutOfRangeAreRefused) {
  absl::Status s = LoadBytes(FrameSafetensors(Header("F32", "[1,2,2]", "[16,80]"), Body()));
  EXPECT_THAT(s.message(), HasSubstr("data_offsets [16, 80) out of range of the 64-byte"));
  s = LoadBytes(FrameSafetensors(Header("F32", "[1,2,2]", "[32,16]"), Body()));
  EXPECT_THAT(s.message(), HasSubstr("out of range"));
  // Overlapping tensors.
  s = LoadBytes(FrameSafetensors(Header("F32", "[1,2,2]", "[8,24]"), Body()));
  EXPECT_THAT(s.message(), HasSubstr("overlap"));
  // A header length beyond the file.
  std::string framed = FrameSafetensors(Header(), Body());
  framed[5] = 1;
  EXPECT_EQ(LoadBytes(framed).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Safetensors, SchemaErrorsNameTheTensor) {
  const std::string no_pos = absl::StrReplaceAll(
      Header(),
      {{",\"positions\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[48,64]}", ""}});
  EXPECT_THAT(LoadBytes(FrameSafetensors(no_pos, Body().substr(0, 48))).message(),
              HasSubstr("missing tensor 'positions'"));
  std::string body = Body();
  const int64_t pos[2] = {5, 6};
  std::memcpy(body.data() + 48, pos, sizeof(pos));
  EXPECT_THAT(LoadBytes(FrameSafetensors(Header(), body)).message(),
              HasSubstr("positions[0] = 5, expected 0"));
  const std::string meta = absl::StrReplaceAll(
      Header(), {{"{\"layer0.q\"", "{\"__metadata__\":{\"rope\":\"none\"},\"layer0.q\""}});
  EXPECT_THAT(LoadBytes(FrameSafetensors(meta, Body())).message(), HasSubstr("rotary"));
}

TEST(Generator, IsDeterministic) {
  const KvDataset a = TinyDataset();
  const KvDataset b = TinyDataset();
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.v, b.v);
}

TEST(Generator, HitsItsStatisticTargets) {
  for (Profile profile : {Profile::kStandard, Profile::kRedundant}) {
    GeneratorConfig c = GeneratorConfig::ForProfile(profile);
    const GeneratorConfig small = SmallConfig();
    c.layers = small.layers;
    c.q_heads = small.q_heads;
    c.kv_heads = small.kv_heads;
    c.head_dim = small.head_dim;
    c.context = small.context;
    c.future = small.future;
    c.duplicate_max = std::min(c.duplicate_max, 32);
    absl::StatusOr<KvDataset> d = Generate(c);
    ASSERT_TRUE(d.ok()) << d.status();
    absl::StatusOr<PastAttention> past = ComputePastAttention(*d, c.context, {});
    ASSERT_TRUE(past.ok()) << past.status();
    absl::StatusOr<FutureReference> ref = ComputeFutureReference(*d, c.context, 64, 1);
    ASSERT_TRUE(ref.ok()) << ref.status();
    const DatasetStatistics st = MeasureStatistics(*d, *past, *ref);
    for (const StatisticRow& row : StatisticRows(st, profile == Profile::kRedundant)) {
      if (row.has_target) {
        EXPECT_TRUE(row.met) << ProfileName(profile) << ": " << row.name << ": " << row.measured
                             << " (target " << row.target << ")";
      }
    }
  }
}

TEST(Accounting, CountsEveryByte) {
  const AccountingShape shape{
      .layers = 2, .kv_heads = 1, .head_dim = 4, .context = 8, .scale_group = 4};
  EXPECT_EQ(FullFp16Bytes(shape), 2u * 8 * 2 * 4 * 2);  // 256
  RetentionPlan plan;
  plan.index_cost = IndexCost::kPerUnit;
  // Unit 0: keeps 0 (FP16), 2 and 5 (INT8, two key-scale groups), 7 (FP16).
  plan.units.push_back({{0, 2, 5, 7}, {0, 1, 1, 0}});
  // Unit 1: keeps everything in FP16: no index list.
  plan.units.push_back({{0, 1, 2, 3, 4, 5, 6, 7}, {}});
  const ByteCounts b = CountBytes(shape, plan);
  EXPECT_EQ(b.fp16, (2u + 8u) * 2 * 4 * 2);  // 160
  EXPECT_EQ(b.int8_codes, 2u * 2 * 4);       // 16
  EXPECT_EQ(b.value_scales, 2u * 4);         // 8
  EXPECT_EQ(b.key_scales, 2u * 4 * 4);       // two groups x 4 channels x fp32 = 32
  EXPECT_EQ(b.indices, 4u * 4);              // unit 0 only
  EXPECT_EQ(b.total(), 232u);

  // A shared decision costs the same payload in every unit and one index list.
  const std::vector<TokenChoice> c = {
      TokenChoice::kFull,   TokenChoice::kPruned, TokenChoice::kInt8,   TokenChoice::kInt8,
      TokenChoice::kPruned, TokenChoice::kPruned, TokenChoice::kPruned, TokenChoice::kFull};
  const ByteCounts shared = SharedDecisionBytes(shape, c);
  EXPECT_EQ(shared.fp16, 2u * (2 * 2 * 4 * 2));
  EXPECT_EQ(shared.int8_codes, 2u * (2 * 2 * 4));
  EXPECT_EQ(shared.key_scales, 2u * (1 * 4 * 4));
  EXPECT_EQ(shared.value_scales, 2u * (2 * 4));
  EXPECT_EQ(shared.indices, 4u * 4);
  const ByteCounts via_plan = CountBytes(shape, SharedDecisionPlan(shape, c));
  EXPECT_EQ(via_plan.total(), shared.total());
}

TEST(Accounting, Int8AloneIsAboutHalf) {
  const AccountingShape shape{
      .layers = 1, .kv_heads = 1, .head_dim = 128, .context = 2048, .scale_group = 64};
  UnitPlan all;
  for (int32_t t = 0; t < 2048; ++t) all.kept.push_back(t);
  all.int8.assign(2048, 1);
  const RetentionPlan plan{{all}, IndexCost::kNone};
  const double f = static_cast<double>(CountBytes(shape, plan).total()) /
                   static_cast<double>(FullFp16Bytes(shape));
  EXPECT_NEAR(f, 0.5 + 1.0 / 64 + 1.0 / 128, 1e-12);
}

TEST(Policies, PlansFitTheirBudgetAndUseIt) {
  GeneratorConfig c = SmallConfig();
  c.layers = 2;
  c.head_dim = 64;
  c.context = 640;  // the protected 68 tokens fit the smallest budget
  c.future = 16;
  absl::StatusOr<KvDataset> d = Generate(c);
  ASSERT_TRUE(d.ok());
  absl::StatusOr<PastAttention> past = ComputePastAttention(*d, c.context, {});
  ASSERT_TRUE(past.ok());
  absl::StatusOr<FutureReference> ref = ComputeFutureReference(*d, c.context, 64, 1);
  ASSERT_TRUE(ref.ok());
  PolicyContext ctx{&*d,
                    &*past,
                    {.layers = c.layers,
                     .kv_heads = c.kv_heads,
                     .head_dim = c.head_dim,
                     .context = c.context,
                     .scale_group = 64}};
  ImportanceOptions ours;
  ImportanceOptions ours_int8;
  ours_int8.int8 = true;
  ImportanceOptions ours_head = ours_int8;
  ours_head.granularity = Granularity::kHead;
  std::vector<std::unique_ptr<RetentionPolicy>> policies;
  policies.push_back(MakeStreamingPolicy(ctx, 4));
  policies.push_back(MakeH2oPolicy(ctx));
  policies.push_back(MakeSnapKvPolicy(ctx, 32, 7));
  policies.push_back(MakeImportancePolicy(ctx, ours, "ours"));
  policies.push_back(MakeImportancePolicy(ctx, ours_int8, "ours-int8"));
  policies.push_back(MakeImportancePolicy(ctx, ours_head, "ours-head-int8"));
  const uint64_t full = FullFp16Bytes(ctx.shape);
  const uint64_t token_bytes = static_cast<uint64_t>(ctx.shape.units()) * 4 * c.head_dim;
  for (const auto& p : policies) {
    for (double f : {0.15, 0.37, 0.75, 1.0}) {
      const uint64_t budget = static_cast<uint64_t>(f * static_cast<double>(full));
      const RetentionPlan plan = p->Plan(budget);
      const uint64_t used = CountBytes(ctx.shape, plan).total();
      EXPECT_LE(used, budget) << p->name() << " at " << f;
      // Nearly all of it: less than two FP16 tokens per unit (plus key-scale rounding) unused.
      EXPECT_GT(used + 2 * token_bytes + 4 * c.head_dim * ctx.shape.units(), budget)
          << p->name() << " at " << f;
      absl::StatusOr<PlanMetrics> m = EvaluatePlan(*d, *ref, ctx.shape, plan, 1);
      ASSERT_TRUE(m.ok()) << m.status();
      if (f == 1.0) {
        EXPECT_LT(m->output_error, 1e-6) << p->name();
      }
    }
  }
}

}  // namespace
}  // namespace kvcache::eval
