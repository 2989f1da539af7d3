#include "comm_backends/ps/protocol.h"

#include <bit>
#include <cstring>
#include <sstream>

#include "compression/codec.h"

namespace commsched::ps {
namespace {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian; add byte swaps");

template <typename T>
void put(std::span<std::byte, kHeaderBytes> out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}
template <typename T>
T get(std::span<const std::byte> in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}

Decoded fail(std::string why) { return Decoded{std::nullopt, std::move(why)}; }

bool is_data_type(MsgType t) {
  return t == MsgType::push_pull || t == MsgType::sum || t == MsgType::bcast || t == MsgType::bcast_data;
}
bool is_text_type(MsgType t) {
  return t == MsgType::hello || t == MsgType::peers || t == MsgType::error || t == MsgType::peer_lost ||
         t == MsgType::lags;
}

// Range checks of data messages: whole elements, inside the tensor, within the size limit.
std::string check_range(const Header& h, const DecodeLimits& limits) {
  std::ostringstream os;
  const uint64_t es = dtype_size(h.dtype);
  if (h.length == 0) os << "empty range (length 0) for key " << h.key;
  else if (h.length > limits.max_payload_bytes)
    os << "length " << h.length << " exceeds the limit " << limits.max_payload_bytes << " for key " << h.key;
  else if (h.offset % es != 0 || h.length % es != 0)
    os << "offset " << h.offset << "/length " << h.length << " not a multiple of the " << dtype_name(h.dtype)
       << " element size for key " << h.key;
  else if (h.offset > h.tensor_bytes || h.length > h.tensor_bytes - h.offset)
    os << "range [" << h.offset << ", +" << h.length << ") outside the tensor of " << h.tensor_bytes
       << " bytes for key " << h.key;
  return os.str();
}

std::string check_payload(const Header& h, std::optional<uint64_t> payload) {
  const uint64_t n = payload.value_or(0);
  std::ostringstream os;
  if (h.type == MsgType::push_pull || h.type == MsgType::sum) {
    if (!payload || n != h.length)
      os << msg_type_name(h.type) << " for key " << h.key << " declares " << h.length << " bytes but carries "
         << (payload ? std::to_string(n) : std::string("no payload frame"));
  } else if (h.type == MsgType::bcast || h.type == MsgType::bcast_data) {
    if (n != 0 && n != h.length)
      os << msg_type_name(h.type) << " for key " << h.key << " declares " << h.length << " bytes but carries " << n;
  } else if (is_text_type(h.type)) {
    if (n > kMaxTextPayload) os << msg_type_name(h.type) << " text payload of " << n << " bytes is too long";
  } else if (n != 0) {
    os << msg_type_name(h.type) << " must not carry a payload (got " << n << " bytes)";
  }
  return os.str();
}

}  // namespace

std::string_view msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::hello: return "hello";
    case MsgType::peers: return "peers";
    case MsgType::assign_req: return "assign_req";
    case MsgType::assign_rep: return "assign_rep";
    case MsgType::push_pull: return "push_pull";
    case MsgType::sum: return "sum";
    case MsgType::bcast: return "bcast";
    case MsgType::bcast_data: return "bcast_data";
    case MsgType::ping: return "ping";
    case MsgType::error: return "error";
    case MsgType::peer_lost: return "peer_lost";
    case MsgType::bye: return "bye";
    case MsgType::received: return "received";
    case MsgType::join: return "join";
    case MsgType::joined: return "joined";
    case MsgType::lags: return "lags";
  }
  return "unknown";
}

std::string peer_name(PeerRole role, uint32_t rank) {
  const char* r = role == PeerRole::worker ? "worker " : role == PeerRole::server ? "server " : "tool ";
  return r + std::to_string(rank);
}

bool carries_data(MsgType t) { return t == MsgType::push_pull || t == MsgType::sum; }
bool allows_payload(MsgType t) { return is_data_type(t) || is_text_type(t); }

void encode_header(const Header& h, std::span<std::byte, kHeaderBytes> out) {
  std::memset(out.data(), 0, kHeaderBytes);
  put<uint32_t>(out, 0, kMagic);
  put<uint16_t>(out, 4, kVersion);
  put<uint8_t>(out, 6, static_cast<uint8_t>(h.type));
  put<uint8_t>(out, 7, static_cast<uint8_t>(h.dtype));
  put<uint8_t>(out, 8, static_cast<uint8_t>(h.sender_role));
  put<uint8_t>(out, 9, h.flags);
  put<uint32_t>(out, 12, h.sender_rank);
  put<uint64_t>(out, 16, h.key);
  put<uint64_t>(out, 24, h.offset);
  put<uint64_t>(out, 32, h.length);
  put<uint64_t>(out, 40, h.tensor_bytes);
  put<uint64_t>(out, 48, h.iteration);
  put<uint64_t>(out, 56, h.round);
  put<uint64_t>(out, 64, h.request_id);
  put<uint32_t>(out, 72, h.aux);
  put<uint8_t>(out, 10, h.codec);
  put<uint32_t>(out, 76, h.elements);
}

namespace {
// The codecs a server decodes, from the codec registry: "topk, signsgd".
std::string server_decoded_names() {
  std::string out;
  for (const compression::Codec& c : compression::codecs())
    if (c.summing == compression::Summing::server_decodes) out += (out.empty() ? "" : ", ") + std::string(c.name);
  return out;
}

// A codec only on data that a server sums, only one it decodes, and always with the element count it needs.
std::string check_codec(const Header& h) {
  if (h.codec == 0) return h.elements == 0 ? std::string() : "element count " + std::to_string(h.elements) +
                                                                 " without a codec";
  const auto s = static_cast<compression::Scheme>(h.codec);
  if (h.type != MsgType::push_pull && h.type != MsgType::sum)
    return std::string(msg_type_name(h.type)) + " with codec " + std::to_string(h.codec);
  if (!compression::is_registered(h.codec) || !compression::server_decodes(s))
    return "codec " + std::to_string(h.codec) + " is not one a server decodes (" + server_decoded_names() + ")";
  return {};
}
}  // namespace

Decoded decode_header(std::span<const std::byte> frame, std::optional<uint64_t> payload_bytes,
                      const DecodeLimits& limits) {
  if (frame.size() != kHeaderBytes)
    return fail("header frame is " + std::to_string(frame.size()) + " bytes, expected " + std::to_string(kHeaderBytes));
  if (const auto magic = get<uint32_t>(frame, 0); magic != kMagic) {
    std::ostringstream os;
    os << "bad magic 0x" << std::hex << magic << " (not a commsched PS message)";
    return fail(os.str());
  }
  if (const auto v = get<uint16_t>(frame, 4); v != kVersion)
    return fail("protocol version " + std::to_string(v) + " not supported (expected " + std::to_string(kVersion) + ")");
  const auto type = get<uint8_t>(frame, 6);
  if (type == 0 || type > kMaxMsgType) return fail("unknown message type " + std::to_string(type));
  const auto role = get<uint8_t>(frame, 8);
  if (role > static_cast<uint8_t>(PeerRole::tool)) return fail("unknown sender role " + std::to_string(role));
  if (get<uint8_t>(frame, 11) != 0) return fail("reserved header bytes not zero");
  Header h;
  h.type = static_cast<MsgType>(type);
  h.sender_role = static_cast<PeerRole>(role);
  h.flags = get<uint8_t>(frame, 9);
  if ((h.flags & ~kKnownFlags) != 0) return fail("unknown header flags " + std::to_string(h.flags));
  h.sender_rank = get<uint32_t>(frame, 12);
  h.key = get<uint64_t>(frame, 16);
  h.offset = get<uint64_t>(frame, 24);
  h.length = get<uint64_t>(frame, 32);
  h.tensor_bytes = get<uint64_t>(frame, 40);
  h.iteration = get<uint64_t>(frame, 48);
  h.round = get<uint64_t>(frame, 56);
  h.request_id = get<uint64_t>(frame, 64);
  h.aux = get<uint32_t>(frame, 72);
  h.codec = get<uint8_t>(frame, 10);
  h.elements = get<uint32_t>(frame, 76);
  if (auto why = check_codec(h); !why.empty()) return fail(why);
  const auto dtype = get<uint8_t>(frame, 7);
  if (is_data_type(h.type)) {
    if (!is_valid_dtype(dtype)) return fail("unknown dtype " + std::to_string(dtype) + " for key " + std::to_string(h.key));
    h.dtype = static_cast<DType>(dtype);
    if (auto why = check_range(h, limits); !why.empty()) return fail(why);
  }
  if (auto why = check_payload(h, payload_bytes); !why.empty()) return fail(why);
  return Decoded{h, {}};
}

}  // namespace commsched::ps
