// Decoder tests: every field validated; truncated, oversized and garbage input rejected with a clear error.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>

#include "comm_backends/ps/protocol.h"
#include "compression/codec.h"

using namespace commsched;
using namespace commsched::ps;

namespace {

Header data_header() {
  Header h;
  h.type = MsgType::push_pull;
  h.dtype = DType::f32;
  h.sender_role = PeerRole::worker;
  h.sender_rank = 3;
  h.key = 0x1234567890abcdefull;
  h.offset = 4096;
  h.length = 1024;
  h.tensor_bytes = 8192;
  h.iteration = 7;
  h.round = 9;
  h.request_id = 42;
  h.aux = 5;
  return h;
}

std::array<std::byte, kHeaderBytes> encode(const Header& h) {
  std::array<std::byte, kHeaderBytes> b;
  encode_header(h, b);
  return b;
}

std::string error_of(std::span<const std::byte> frame, std::optional<uint64_t> payload) {
  Decoded d = decode_header(frame, payload);
  EXPECT_FALSE(d.header.has_value());
  return d.error;
}

}  // namespace

TEST(PsProtocol, RoundTripsEveryField) {
  const Header h = data_header();
  auto b = encode(h);
  Decoded d = decode_header(b, 1024);
  ASSERT_TRUE(d.header) << d.error;
  EXPECT_EQ(d.header->type, h.type);
  EXPECT_EQ(d.header->dtype, h.dtype);
  EXPECT_EQ(d.header->sender_rank, 3u);
  EXPECT_EQ(d.header->key, h.key);
  EXPECT_EQ(d.header->offset, 4096u);
  EXPECT_EQ(d.header->length, 1024u);
  EXPECT_EQ(d.header->tensor_bytes, 8192u);
  EXPECT_EQ(d.header->iteration, 7u);
  EXPECT_EQ(d.header->round, 9u);
  EXPECT_EQ(d.header->request_id, 42u);
  EXPECT_EQ(d.header->aux, 5u);
  EXPECT_EQ(d.header->codec, 0u);
  EXPECT_EQ(d.header->elements, 0u);
  Header c = h;  // a compressed push: the codec and the element count before encoding travel too
  c.codec = static_cast<uint8_t>(commsched::compression::Scheme::topk);
  c.elements = 2048;
  d = decode_header(encode(c), 1024);
  ASSERT_TRUE(d.header) << d.error;
  EXPECT_EQ(d.header->codec, c.codec);
  EXPECT_EQ(d.header->elements, 2048u);
}

// A codec only where a server decodes one (push_pull, sum; topk, signsgd), and an element count only with one.
TEST(PsProtocol, RejectsCodecsWhereNoServerDecodesThem) {
  using commsched::compression::Scheme;
  Header h = data_header();
  h.elements = 10;
  EXPECT_NE(error_of(encode(h), 1024).find("without a codec"), std::string::npos);
  h.codec = static_cast<uint8_t>(Scheme::fp16);
  EXPECT_NE(error_of(encode(h), 1024).find("not one a server decodes"), std::string::npos);
  h.codec = 99;
  EXPECT_NE(error_of(encode(h), 1024).find("not one a server decodes"), std::string::npos);
  h.codec = static_cast<uint8_t>(Scheme::signsgd);
  h.type = MsgType::bcast;
  EXPECT_NE(error_of(encode(h), 1024).find("bcast with codec"), std::string::npos);
}

TEST(PsProtocol, RejectsTruncatedAndOversizedFrames) {
  auto b = encode(data_header());
  for (size_t n : {size_t{0}, size_t{1}, size_t{4}, kHeaderBytes - 1})
    EXPECT_NE(error_of(std::span(b.data(), n), 1024).find("expected 80"), std::string::npos) << n;
  std::vector<std::byte> big(kHeaderBytes + 1);
  std::memcpy(big.data(), b.data(), kHeaderBytes);
  EXPECT_NE(error_of(big, 1024).find("81 bytes"), std::string::npos);
}

TEST(PsProtocol, RejectsBadMagicVersionTypeRoleReserved) {
  auto b = encode(data_header());
  auto bad = b;
  bad[0] = std::byte{'X'};
  EXPECT_NE(error_of(bad, 1024).find("bad magic"), std::string::npos);
  bad = b;
  bad[4] = std::byte{1};
  EXPECT_NE(error_of(bad, 1024).find("version 1"), std::string::npos);
  bad = b;
  bad[6] = std::byte{0};
  EXPECT_NE(error_of(bad, 1024).find("message type 0"), std::string::npos);
  bad[6] = std::byte{200};
  EXPECT_NE(error_of(bad, 1024).find("message type 200"), std::string::npos);
  bad = b;
  bad[8] = std::byte{9};
  EXPECT_NE(error_of(bad, 1024).find("sender role 9"), std::string::npos);
  bad = b;
  bad[9] = std::byte{0x80};
  EXPECT_NE(error_of(bad, 1024).find("flags 128"), std::string::npos);
  bad[9] = std::byte{kFlagAckReceipt};
  EXPECT_TRUE(decode_header(bad, 1024).header.has_value());
  bad = b;
  bad[11] = std::byte{1};
  EXPECT_NE(error_of(bad, 1024).find("reserved"), std::string::npos);
}

TEST(PsProtocol, RejectsBadDtypeAndRanges) {
  Header h = data_header();
  auto b = encode(h);
  b[7] = std::byte{17};
  EXPECT_NE(error_of(b, 1024).find("dtype 17"), std::string::npos);
  h = data_header();
  h.offset = 2;  // not a whole f32
  EXPECT_NE(error_of(encode(h), 1024).find("multiple"), std::string::npos);
  h = data_header();
  h.offset = 8000;  // past the end of the tensor
  EXPECT_NE(error_of(encode(h), 1024).find("outside the tensor"), std::string::npos);
  h = data_header();
  h.offset = ~0ull - 3;  // offset + length overflows
  h.tensor_bytes = ~0ull - 3;
  EXPECT_NE(error_of(encode(h), 1024).find("outside"), std::string::npos);
  h = data_header();
  h.length = 0;
  EXPECT_NE(error_of(encode(h), 0).find("empty range"), std::string::npos);
  h = data_header();
  h.length = h.tensor_bytes = 1ull << 40;
  h.offset = 0;
  EXPECT_NE(error_of(encode(h), h.length).find("exceeds the limit"), std::string::npos);
}

TEST(PsProtocol, PayloadMustMatchDeclaredLength) {
  auto b = encode(data_header());
  EXPECT_NE(error_of(b, std::nullopt).find("no payload"), std::string::npos);
  EXPECT_NE(error_of(b, 1000).find("carries 1000"), std::string::npos);
  EXPECT_NE(error_of(b, 1ull << 33).find("carries"), std::string::npos);
  Header ping;
  ping.type = MsgType::ping;
  EXPECT_NE(error_of(encode(ping), 3).find("must not carry"), std::string::npos);
  Header err;
  err.type = MsgType::error;
  EXPECT_TRUE(decode_header(encode(err), 100).header);
  EXPECT_NE(error_of(encode(err), kMaxTextPayload + 1).find("too long"), std::string::npos);
}

TEST(PsProtocol, GarbageNeverDecodesAndNeverCrashes) {
  std::mt19937_64 rng(7);
  std::vector<std::byte> buf(200);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    const size_t n = rng() % buf.size();
    for (size_t k = 0; k < n; ++k) buf[k] = static_cast<std::byte>(rng());
    accepted += decode_header(std::span(buf.data(), n), rng() % 2 ? std::optional<uint64_t>(rng() % 4096) : std::nullopt)
                    .header.has_value();
  }
  EXPECT_EQ(accepted, 0);  // random bytes essentially never carry the magic, version and zero reserved bytes
  // Valid magic/version but random rest: either a clean decode or a clean error, never anything else.
  auto good = encode(data_header());
  for (int i = 0; i < 20000; ++i) {
    auto b = good;
    for (size_t k = 6; k < kHeaderBytes; ++k)
      if (rng() % 8 == 0) b[k] = static_cast<std::byte>(rng());
    Decoded d = decode_header(b, rng() % 2048);
    EXPECT_TRUE(d.header.has_value() != !d.error.empty());
  }
}
