// The collective wire format (comm_backends/collective/wire + protocol): a byte stream cut into chunks goes through
// the FrameAssembler the way a socket delivers it, and every frame is decoded as the coordinator and the ranks decode
// them. Malformed input may only throw std::runtime_error; a frame that decodes must re-encode to the same bytes.
#include <stdexcept>
#include <string>
#include <string_view>

#include "comm_backends/collective/protocol.h"
#include "comm_backends/collective/wire.h"
#include "tests/fuzz/fuzz_target.h"

using namespace commsched::collective;

namespace {

// Decoding may normalise (a flag byte 2 reads as true; trailing bytes are ignored), but what it produces must be
// stable: encoding it and decoding that again gives the same bytes.
template <typename Decode, typename Encode>
void check_stable(const std::string& frame, Decode decode, Encode encode) {
  ByteReader r(frame, "fuzz frame");
  read_type(r);
  const std::string once = encode(decode(r));
  ByteReader r2(std::string_view(once).substr(4), "re-encoded frame");
  read_type(r2);
  FUZZ_CHECK(encode(decode(r2)) == once);
  FUZZ_CHECK(r2.done());
}

void decode_frame(const std::string& frame) {
  ByteReader r(frame, "fuzz frame");
  switch (read_type(r)) {
    case MsgType::ready: return check_stable(frame, decode_ready, encode_ready);
    case MsgType::order: return check_stable(frame, decode_order, encode_order);
    case MsgType::error: return check_stable(frame, decode_error, encode_error);
    default: return;
  }
}

}  // namespace

int fuzz_collective_wire(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 64;  // how the socket splits the stream
  FrameAssembler in;
  std::string frame;
  try {
    for (size_t at = 1; at < size; at += chunk) {
      const size_t n = std::min(chunk, size - at);
      in.append(reinterpret_cast<const char*>(data + at), n);
      while (in.next(frame, "fuzz stream")) {
        FUZZ_CHECK(frame.size() <= kMaxFrameBytes);
        try {
          decode_frame(frame);
        } catch (const std::runtime_error&) {
        }
      }
    }
  } catch (const std::runtime_error&) {
    // an oversized frame: the connection would be dropped
  }
  return 0;
}

COMMSCHED_FUZZ_TARGET(fuzz_collective_wire)
