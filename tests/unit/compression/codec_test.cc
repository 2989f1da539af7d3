// The codecs on their own: round trips for every floating dtype at awkward sizes, error feedback's invariant,
// the wire sizes, and the option parser's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/half.h"
#include "compression/codec.h"

namespace commsched::compression {
namespace {

const uint64_t kSizes[] = {0, 1, 2, 7, 31, 32, 33, 97, 1009, 65537};
const DType kFloats[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

size_t esize(DType d) { return d == DType::f64 ? 8 : (d == DType::f32 ? 4 : 2); }

// n values of dtype d (as bytes) and the same values widened to double.
struct Tensor {
  std::vector<std::byte> bytes;
  std::vector<double> values;
};

double load(DType d, const std::byte* p, uint64_t i) {
  switch (d) {
    case DType::f32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::f64: { double v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case DType::f16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return f16_to_f32(v); }
    default: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return bf16_to_f32(v); }
  }
}

Tensor random_tensor(DType d, uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tensor t;
  t.bytes.resize(n * esize(d));
  for (uint64_t i = 0; i < n; ++i) {
    const float f = dist(rng) * (1 + static_cast<float>(i % 5));  // distinct magnitudes
    switch (d) {
      case DType::f32: std::memcpy(&t.bytes[4 * i], &f, 4); break;
      case DType::f64: { const double v = f * 1.0000001; std::memcpy(&t.bytes[8 * i], &v, 8); break; }
      case DType::f16: { const uint16_t h = f32_to_f16(f); std::memcpy(&t.bytes[2 * i], &h, 2); break; }
      default: { const uint16_t h = f32_to_bf16(f); std::memcpy(&t.bytes[2 * i], &h, 2); break; }
    }
    t.values.push_back(load(d, t.bytes.data(), i));
  }
  return t;
}

std::vector<std::byte> encoded(const Spec& s, DType d, const Tensor& t, void* residual = nullptr) {
  std::vector<std::byte> wire(encoded_bytes(s, d, t.values.size()) + 1);
  encode(s, d, t.bytes.data(), t.values.size(), residual, wire.data());
  return wire;
}

std::vector<double> decoded(const Spec& s, DType d, const std::vector<std::byte>& wire, uint64_t n) {
  std::vector<std::byte> out(n * esize(d) + 1, std::byte{0x5a});
  decode(s, d, wire.data(), n, out.data());
  std::vector<double> v;
  for (uint64_t i = 0; i < n; ++i) v.push_back(load(d, out.data(), i));
  return v;
}

class EveryDtypeAndSize : public ::testing::TestWithParam<std::tuple<DType, uint64_t>> {};

TEST_P(EveryDtypeAndSize, CastsRoundTripToTheNarrowType) {
  const auto [d, n] = GetParam();
  const Tensor t = random_tensor(d, n, 1);
  for (Scheme s : {Scheme::fp16, Scheme::bf16}) {
    const auto out = decoded({s}, d, encoded({s}, d, t), n);
    for (uint64_t i = 0; i < n; ++i) {
      const float f = static_cast<float>(t.values[i]);
      const double want = s == Scheme::fp16 ? f16_to_f32(f32_to_f16(f)) : bf16_to_f32(f32_to_bf16(f));
      ASSERT_EQ(out[i], want) << scheme_name(s) << " element " << i << " of " << n;
    }
  }
}

TEST_P(EveryDtypeAndSize, TopKKeepsExactlyTheLargestAndZeroesTheRest) {
  const auto [d, n] = GetParam();
  const Tensor t = random_tensor(d, n, 2);
  for (double ratio : {0.01, 0.3, 1.0}) {
    const Spec s{Scheme::topk, ratio};
    const auto out = decoded(s, d, encoded(s, d, t), n);
    const uint64_t k = topk_count(ratio, n);
    std::vector<double> mags;
    for (double v : t.values) mags.push_back(std::abs(v));
    std::sort(mags.rbegin(), mags.rend());
    uint64_t kept = 0;
    for (uint64_t i = 0; i < n; ++i) {
      if (out[i] == 0 && t.values[i] != 0) continue;
      ++kept;
      ASSERT_EQ(out[i], t.values[i]) << "a kept element is sent exactly (element " << i << ")";
      ASSERT_GE(std::abs(t.values[i]), mags[k - 1]) << "only the k largest are kept";
    }
    EXPECT_LE(kept, k);
    if (n > 0) {
      EXPECT_GE(kept, 1u);
    }
  }
}

TEST_P(EveryDtypeAndSize, SignSendsTheSignTimesTheMeanMagnitude) {
  const auto [d, n] = GetParam();
  const Tensor t = random_tensor(d, n, 3);
  const auto out = decoded({Scheme::signsgd}, d, encoded({Scheme::signsgd}, d, t), n);
  double l1 = 0;
  for (double v : t.values) l1 += std::abs(v);
  const double scale = n ? l1 / n : 0;
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i] >= 0, t.values[i] >= 0) << "element " << i;
    ASSERT_NEAR(std::abs(out[i]), scale, 1e-2 * scale + 1e-6) << "element " << i;
  }
}

// residual_after + sent == gradient + residual_before, over several rounds (what top-k and signSGD leave behind is
// sent later, never lost).
TEST_P(EveryDtypeAndSize, ErrorFeedbackKeepsResidualPlusSentEqualToTheAccumulatedGradient) {
  const auto [d, n] = GetParam();
  for (const Spec s : {Spec{Scheme::topk, 0.05}, Spec{Scheme::signsgd}}) {
    const DType rd = residual_dtype(d);
    std::vector<std::byte> residual(n * esize(rd) + 1, std::byte{0});
    std::vector<double> total_grad(n, 0), total_sent(n, 0);
    for (uint32_t round = 0; round < 4; ++round) {
      const Tensor g = random_tensor(d, n, 10 + round);
      std::vector<double> before(n);
      for (uint64_t i = 0; i < n; ++i) before[i] = load(rd, residual.data(), i);
      const auto sent = decoded(s, d, encoded(s, d, g, residual.data()), n);
      for (uint64_t i = 0; i < n; ++i) {
        const double after = load(rd, residual.data(), i);
        // The accumulation type rounds g + residual once; that rounding is the only allowed difference.
        const double acc = rd == DType::f64 ? g.values[i] + before[i] : static_cast<float>(g.values[i] + before[i]);
        const double tol = rd == DType::f64 ? 1e-12 * (1 + std::abs(acc)) : 1e-6 * (1 + std::abs(acc));
        ASSERT_NEAR(after + sent[i], acc, tol) << to_string(s) << " " << dtype_name(d) << " round " << round << " element " << i;
        total_grad[i] += g.values[i];
        total_sent[i] += sent[i];
      }
    }
    for (uint64_t i = 0; i < n; ++i)
      ASSERT_NEAR(total_sent[i] + load(rd, residual.data(), i), total_grad[i], 1e-4 * (1 + std::abs(total_grad[i])));
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, EveryDtypeAndSize, ::testing::Combine(::testing::ValuesIn(kFloats), ::testing::ValuesIn(kSizes)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_n" + std::to_string(std::get<1>(info.param));
                         });

TEST(Codec, WireSizes) {
  EXPECT_EQ(encoded_bytes({Scheme::fp16}, DType::f32, 1001), 2002u);
  EXPECT_EQ(encoded_bytes({Scheme::bf16}, DType::f64, 3), 6u);
  EXPECT_EQ(encoded_bytes({Scheme::topk, 0.01}, DType::f32, 1000), 10u * 8);
  EXPECT_EQ(encoded_bytes({Scheme::topk, 0.01}, DType::f64, 1), 12u) << "at least one element";
  EXPECT_EQ(encoded_bytes({Scheme::signsgd}, DType::f32, 33), 4u + 8);
  EXPECT_EQ(encoded_bytes({Scheme::signsgd}, DType::f32, 0), 4u);
  EXPECT_EQ(topk_count(0.01, 0), 0u);
  EXPECT_EQ(topk_count(0.01, 100), 1u);
  EXPECT_EQ(topk_count(0.011, 100), 2u);
}

TEST(Codec, IntegersAreRefusedNamingTheProblem) {
  int32_t x[4] = {1, 2, 3, 4};
  std::byte out[64];
  EXPECT_FALSE(compressible(DType::i32));
  EXPECT_THROW(encode({Scheme::topk, 0.5}, DType::i32, x, 4, nullptr, out), InvalidArgument);
}

TEST(Codec, CorruptTopKIndexIsRejectedNotWrittenOutOfBounds) {
  std::vector<std::byte> wire(8);
  const uint32_t bad = 1000;
  std::memcpy(wire.data(), &bad, 4);
  float out[4];
  EXPECT_THROW(decode({Scheme::topk, 0.25}, DType::f32, wire.data(), 4, out), InvalidArgument);
}

TEST(Codec, ParsesSchemesAndRejectsBadOnesNamingTheVariable) {
  EXPECT_EQ(parse_spec("V", "none").scheme, Scheme::none);
  EXPECT_EQ(parse_spec("V", "FP16").scheme, Scheme::fp16);
  EXPECT_EQ(parse_spec("V", "bfloat16").scheme, Scheme::bf16);
  EXPECT_EQ(parse_spec("V", "signsgd").scheme, Scheme::signsgd);
  EXPECT_EQ(parse_spec("V", "topk"), (Spec{Scheme::topk, 0.01}));
  EXPECT_EQ(parse_spec("V", "topk:0.25"), (Spec{Scheme::topk, 0.25}));
  EXPECT_EQ(parse_spec("V", to_string(Spec{Scheme::topk, 0.05})), (Spec{Scheme::topk, 0.05}));
  for (const char* bad : {"zip", "topk:0", "topk:1.5", "topk:abc", "topk0.1", "topk:"}) {
    try {
      parse_spec("COMMSCHED_COMPRESSION", bad);
      FAIL() << bad << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("COMMSCHED_COMPRESSION='" + std::string(bad) + "'"), std::string::npos) << e.what();
    }
  }
}

// The codec registry: every row complete, ids and names distinct, every name parses back to its row; an incomplete
// row is named.
TEST(CodecRegistry, EveryRowIsCompleteAndParsesBack) {
  std::vector<std::string> names;
  for (const Codec& c : codecs()) {
    EXPECT_EQ(codec_row_gap(c), "") << c.name;
    EXPECT_EQ(&codec(c.scheme), &c) << c.name << ": one row per scheme";
    EXPECT_TRUE(is_registered(uint8_t(c.scheme)));
    EXPECT_EQ(parse_spec("V", c.name).scheme, c.scheme);
    for (std::string_view a : c.aliases) EXPECT_EQ(parse_spec("V", a).scheme, c.scheme) << a;
    EXPECT_EQ(parse_spec("V", to_string(Spec{c.scheme, 0.5})).scheme, c.scheme);
    for (const std::string& n : names) EXPECT_NE(n, c.name);
    names.emplace_back(c.name);
    EXPECT_NE(specs_allowed().find(c.name), std::string::npos) << "the option's allowed text lists " << c.name;
  }
  EXPECT_FALSE(is_registered(200));
  EXPECT_THROW(codec(static_cast<Scheme>(200)), InvalidArgument);
}

TEST(CodecRegistry, AnIncompleteRowIsNamed) {
  Codec c = codec(Scheme::topk);
  c.name = "probe";
  c.encode_sum = nullptr;  // a server decodes it, but could not answer
  EXPECT_NE(codec_row_gap(c).find("'probe'"), std::string::npos) << codec_row_gap(c);
  c = codec(Scheme::fp16);
  c.name = "probe";
  c.encode_s_per_mib = 0;  // the simulator would model it as free
  EXPECT_NE(codec_row_gap(c).find("stage costs"), std::string::npos) << codec_row_gap(c);
  c = codec(Scheme::bf16);
  c.wire_dtype = DType::i32;
  EXPECT_NE(codec_row_gap(c).find("wire dtype"), std::string::npos) << codec_row_gap(c);
  c = codec(Scheme::none);
  c.decode = nullptr;
  EXPECT_NE(codec_row_gap(c).find("decode"), std::string::npos) << codec_row_gap(c);
}

// What a server can sum is the registry's word, for the backend and for the protocol alike.
TEST(CodecRegistry, WhatAServerDecodesComesFromTheRows) {
  for (const Codec& c : codecs()) {
    EXPECT_EQ(server_decodes(c.scheme), c.summing == Summing::server_decodes) << c.name;
    Spec out;
    EXPECT_EQ(wire_spec(c.scheme, DType::f32, 64, encoded_bytes({c.scheme, 0.25}, DType::f32, 64), out).empty(),
              server_decodes(c.scheme))
        << c.name;
  }
}

}  // namespace
}  // namespace commsched::compression
