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
  h.priority = -17;
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
  EXPECT_EQ(d.header->priority, -17);
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
    EXPECT_NE(error_of(std::span(b.data(), n), 1024).find("expected 88"), std::string::npos) << n;
  std::vector<std::byte> big(kHeaderBytes + 1);
  std::memcpy(big.data(), b.data(), kHeaderBytes);
  EXPECT_NE(error_of(big, 1024).find("89 bytes"), std::string::npos);
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
  bad = b;
  bad[87] = std::byte{1};
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

namespace {

// A push_pull_batch of three ranges (f32, f16, i64) with its table and zeroed data, and its header.
struct Batch {
  Header h;
  std::vector<BatchEntry> entries;
  std::vector<std::byte> payload;
};

Batch three_entries() {
  Batch b;
  b.entries = {BatchEntry{11, 0, 400, 400, 2, DType::f32, 0}, BatchEntry{12, 64, 6, 128, 2, DType::f16, 0},
               BatchEntry{13, 8, 24, 64, 3, DType::i64, 0}};
  b.payload.resize(batch_layout(b.entries));
  encode_batch_table(b.entries, b.payload);
  b.h.type = MsgType::push_pull_batch;
  b.h.sender_rank = 2;
  b.h.request_id = 77;
  b.h.aux = static_cast<uint32_t>(b.entries.size());
  b.h.length = b.payload.size();
  return b;
}

std::string batch_error(const Batch& b) {
  const DecodedBatch d = decode_batch(b.h, b.payload);
  EXPECT_TRUE(d.entries.empty());
  return d.error;
}

void put64(std::vector<std::byte>& p, size_t at, uint64_t v) { std::memcpy(p.data() + at, &v, 8); }

}  // namespace

TEST(PsProtocol, BatchRoundTripsAlignedEntries) {
  Batch b = three_entries();
  // Table 3 x 48 = 144 -> 192; 400 bytes -> 192..592, next at 640; 6 bytes -> 640..646, next at 704; 24 -> 728 -> 768.
  EXPECT_EQ(b.entries[0].at, 192u);
  EXPECT_EQ(b.entries[1].at, 640u);
  EXPECT_EQ(b.entries[2].at, 704u);
  EXPECT_EQ(b.payload.size(), 768u);
  const Decoded hd = decode_header(encode(b.h), b.payload.size());
  ASSERT_TRUE(hd.header) << hd.error;
  const DecodedBatch d = decode_batch(*hd.header, b.payload);
  ASSERT_TRUE(d.error.empty()) << d.error;
  ASSERT_EQ(d.entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d.entries[i].key, b.entries[i].key);
    EXPECT_EQ(d.entries[i].offset, b.entries[i].offset);
    EXPECT_EQ(d.entries[i].length, b.entries[i].length);
    EXPECT_EQ(d.entries[i].tensor_bytes, b.entries[i].tensor_bytes);
    EXPECT_EQ(d.entries[i].round, b.entries[i].round);
    EXPECT_EQ(d.entries[i].dtype, b.entries[i].dtype);
    EXPECT_EQ(d.entries[i].at, b.entries[i].at);
  }
  const Header e = entry_header(*hd.header, d.entries[1]);
  EXPECT_EQ(e.type, MsgType::push_pull);
  EXPECT_EQ(e.key, 12u);
  EXPECT_EQ(e.request_id, 77u);
  EXPECT_EQ(e.sender_rank, 2u);
}

TEST(PsProtocol, BatchHeaderRejectsCountsFlagsAndRanges) {
  Batch b = three_entries();
  EXPECT_NE(error_of(encode(b.h), std::nullopt).find("no payload"), std::string::npos);
  EXPECT_NE(error_of(encode(b.h), 700).find("carries 700"), std::string::npos);
  Header h = b.h;
  h.aux = 0;
  EXPECT_NE(error_of(encode(h), h.length).find("0 entries"), std::string::npos);
  h.aux = kMaxBatchEntries + 1;
  EXPECT_NE(error_of(encode(h), h.length).find("entries (1 to"), std::string::npos);
  h = b.h;
  h.length = 100;
  EXPECT_NE(error_of(encode(h), 100).find("cannot hold its table"), std::string::npos);
  h = b.h;
  h.flags = kFlagAsync;
  EXPECT_NE(error_of(encode(h), h.length).find("only the receipt flag"), std::string::npos);
  h = b.h;
  h.key = 5;
  EXPECT_NE(error_of(encode(h), h.length).find("names a key"), std::string::npos);
}

TEST(PsProtocol, BatchTableRejectsBadEntriesNamingThem) {
  Batch b = three_entries();
  b.payload[48 + 40] = std::byte{99};  // entry 1's dtype
  EXPECT_NE(batch_error(b).find("entry 1: unknown dtype 99 for key 12"), std::string::npos) << batch_error(b);
  b = three_entries();
  b.payload[2 * 48 + 45] = std::byte{1};
  EXPECT_NE(batch_error(b).find("entry 2: reserved"), std::string::npos) << batch_error(b);
  b = three_entries();
  put64(b.payload, 2 * 48 + 8, 48);  // i64 range [48, +24) of a 64-byte tensor
  EXPECT_NE(batch_error(b).find("entry 2: range [48, +24) outside the tensor of 64 bytes for key 13"),
            std::string::npos) << batch_error(b);
  b = three_entries();
  put64(b.payload, 16, 460);  // entry 0 grows past its padding: the layout no longer matches the payload
  put64(b.payload, 24, 460);
  EXPECT_NE(batch_error(b).find("its table lays out"), std::string::npos) << batch_error(b);
  b = three_entries();
  put64(b.payload, 16, ~0ull - 3);  // a length near 2^64 neither wraps nor reads outside
  put64(b.payload, 24, ~0ull - 3);
  EXPECT_FALSE(batch_error(b).empty());
  b = three_entries();
  b.payload.resize(300);  // the payload the header promised is not all there
  EXPECT_NE(batch_error(b).find("exceed the payload"), std::string::npos) << batch_error(b);
}
