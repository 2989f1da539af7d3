// PS header + frame decoding (comm_backends/ps/protocol): any bytes as the header frame, with or without a payload
// frame of any size. decode_header must never read outside the frame, never throw, and every header it accepts must
// survive an encode/decode round trip unchanged and satisfy the invariants the server relies on.
#include <cstring>
#include <optional>
#include <span>

#include "comm_backends/ps/protocol.h"
#include "tests/fuzz/fuzz_target.h"

using namespace commsched::ps;

namespace {
// A batch's table: every entry it accepts lies inside the payload, aligned, in order, and is a range of its tensor.
void check_batch(const Header& h, std::span<const std::byte> payload, const DecodeLimits& limits) {
  const DecodedBatch b = decode_batch(h, payload, limits);
  FUZZ_CHECK(b.entries.empty() != b.error.empty());
  uint64_t end = uint64_t{h.aux} * kBatchEntryBytes;
  for (const BatchEntry& e : b.entries) {
    FUZZ_CHECK(e.at % kBatchAlign == 0 && e.at >= end && e.length <= payload.size() - e.at);
    FUZZ_CHECK(e.length > 0 && e.offset <= e.tensor_bytes && e.length <= e.tensor_bytes - e.offset);
    end = e.at + e.length;
  }
}
}  // namespace

int fuzz_ps_header(const uint8_t* data, size_t size) {
  // First 9 bytes: payload presence and size (so the fuzzer explores both); the rest is the header frame. With bit 1
  // of the first byte set, the header frame is the next 80 bytes and the payload is what follows (its bytes, for a
  // batch's table).
  std::optional<uint64_t> payload;
  if (size >= 9 && (data[0] & 1)) {
    uint64_t n;
    std::memcpy(&n, data + 1, 8);
    payload = n;
  }
  const size_t skip = size >= 9 ? 9 : size;
  const bool with_bytes = size >= skip + kHeaderBytes && (data[0] & 2);
  std::span<const std::byte> frame(reinterpret_cast<const std::byte*>(data + skip),
                                   with_bytes ? kHeaderBytes : size - skip);
  std::span<const std::byte> body(reinterpret_cast<const std::byte*>(data + skip) + frame.size(),
                                  size - skip - frame.size());
  if (with_bytes) payload = body.size();
  DecodeLimits limits;
  limits.max_payload_bytes = 1ull << 30;
  const Decoded d = decode_header(frame, payload, limits);
  FUZZ_CHECK(d.header.has_value() != !d.error.empty());
  if (!d.header) return 0;
  const Header& h = *d.header;
  if (carries_data(h.type)) {
    FUZZ_CHECK(payload && *payload == h.length);
    FUZZ_CHECK(h.length > 0 && h.length <= limits.max_payload_bytes);
    FUZZ_CHECK(h.offset <= h.tensor_bytes && h.length <= h.tensor_bytes - h.offset);
  }
  if (!allows_payload(h.type)) FUZZ_CHECK(payload.value_or(0) == 0);
  if (with_bytes && (h.type == MsgType::push_pull_batch || h.type == MsgType::sum_batch)) check_batch(h, body, limits);
  std::byte again[kHeaderBytes];
  encode_header(h, std::span<std::byte, kHeaderBytes>(again));
  const Decoded d2 = decode_header(again, payload, limits);
  FUZZ_CHECK(d2.header.has_value());
  FUZZ_CHECK(std::memcmp(again, frame.data(), kHeaderBytes) == 0 ||
             // the dtype byte of non-data messages is not part of their meaning and is not kept
             !carries_data(h.type));
  return 0;
}

COMMSCHED_FUZZ_TARGET(fuzz_ps_header)
