#include "comm_backends/ps/protocol.h"

#include <algorithm>
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
bool is_batch_type(MsgType t) { return t == MsgType::push_pull_batch || t == MsgType::sum_batch; }
bool is_text_type(MsgType t) {
  return t == MsgType::error || t == MsgType::peer_lost ||
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
  } else if (is_batch_type(h.type)) {
    if (!payload || n != h.length)
      os << msg_type_name(h.type) << " declares " << h.length << " bytes but carries "
         << (payload ? std::to_string(n) : std::string("no payload frame"));
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
    case MsgType::push_pull_batch: return "push_pull_batch";
    case MsgType::sum_batch: return "sum_batch";
  }
  return "unknown";
}

std::string peer_name(PeerRole role, uint32_t rank) {
  const char* r = role == PeerRole::worker ? "worker " : role == PeerRole::server ? "server " : "tool ";
  return r + std::to_string(rank);
}

bool carries_data(MsgType t) { return t == MsgType::push_pull || t == MsgType::sum; }
bool allows_payload(MsgType t) { return is_data_type(t) || is_text_type(t) || is_batch_type(t); }

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
  put<int32_t>(out, 80, h.priority);
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
// A batch's own header names no range: its entries do (decode_batch).
std::string check_batch_header(const Header& h, const DecodeLimits& limits) {
  std::ostringstream os;
  if (h.aux == 0 || h.aux > kMaxBatchEntries)
    os << msg_type_name(h.type) << " of " << h.aux << " entries (1 to " << kMaxBatchEntries << " allowed)";
  else if (h.length > limits.max_payload_bytes)
    os << msg_type_name(h.type) << " of " << h.length << " bytes exceeds the limit " << limits.max_payload_bytes;
  else if (h.length < uint64_t{h.aux} * kBatchEntryBytes)
    os << msg_type_name(h.type) << " of " << h.length << " bytes cannot hold its table of " << h.aux << " entries";
  else if (h.flags & ~kFlagAckReceipt)
    os << msg_type_name(h.type) << " with flags " << unsigned{h.flags} << " (only the receipt flag may be batched)";
  else if (h.key != 0 || h.offset != 0 || h.tensor_bytes != 0)
    os << msg_type_name(h.type) << " names a key or range in its header (its entries do)";
  return os.str();
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
  // A number no type has any more (2, the old peer table) is as unknown as one never used.
  if (type == 0 || type > kMaxMsgType || msg_type_name(static_cast<MsgType>(type)) == "unknown")
    return fail("unknown message type " + std::to_string(type));
  const auto role = get<uint8_t>(frame, 8);
  if (role > static_cast<uint8_t>(PeerRole::tool)) return fail("unknown sender role " + std::to_string(role));
  if (get<uint8_t>(frame, 11) != 0 || get<uint32_t>(frame, 84) != 0) return fail("reserved header bytes not zero");
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
  h.priority = get<int32_t>(frame, 80);
  if (auto why = check_codec(h); !why.empty()) return fail(why);
  const auto dtype = get<uint8_t>(frame, 7);
  if (is_batch_type(h.type)) {
    if (auto why = check_batch_header(h, limits); !why.empty()) return fail(why);
  } else if (is_data_type(h.type)) {
    if (!is_valid_dtype(dtype)) return fail("unknown dtype " + std::to_string(dtype) + " for key " + std::to_string(h.key));
    h.dtype = static_cast<DType>(dtype);
    if (auto why = check_range(h, limits); !why.empty()) return fail(why);
  }
  if (auto why = check_payload(h, payload_bytes); !why.empty()) return fail(why);
  return Decoded{h, {}};
}

uint64_t batch_layout(std::span<BatchEntry> entries) {
  const auto align = [](uint64_t v) { return (v + kBatchAlign - 1) / kBatchAlign * kBatchAlign; };
  uint64_t at = align(entries.size() * kBatchEntryBytes);
  for (BatchEntry& e : entries) {
    e.at = at;
    at = align(at + e.length);
  }
  return at;
}

void encode_batch_table(std::span<const BatchEntry> entries, std::span<std::byte> out) {
  std::memset(out.data(), 0, std::min<uint64_t>(out.size(), entries.empty() ? 0 : entries.front().at));
  for (size_t i = 0; i < entries.size(); ++i) {
    const BatchEntry& e = entries[i];
    std::byte* p = out.data() + i * kBatchEntryBytes;
    std::memcpy(p, &e.key, 8);
    std::memcpy(p + 8, &e.offset, 8);
    std::memcpy(p + 16, &e.length, 8);
    std::memcpy(p + 24, &e.tensor_bytes, 8);
    std::memcpy(p + 32, &e.round, 8);
    p[40] = static_cast<std::byte>(e.dtype);
    const uint64_t end = e.at + e.length, next = i + 1 < entries.size() ? entries[i + 1].at : out.size();
    if (end < out.size()) std::memset(out.data() + end, 0, std::min<uint64_t>(next, out.size()) - end);
  }
}

std::vector<std::span<const std::byte>> batch_pieces(std::span<const BatchEntry> entries,
                                                     std::span<const std::byte> table,
                                                     std::span<const std::byte* const> data, uint64_t total) {
  static constexpr std::byte kZeros[kBatchAlign] = {};
  std::vector<std::span<const std::byte>> out{table};
  for (size_t i = 0; i < entries.size(); ++i) {
    const BatchEntry& e = entries[i];
    out.emplace_back(data[i], e.length);
    const uint64_t next = i + 1 < entries.size() ? entries[i + 1].at : total;
    if (next > e.at + e.length) out.emplace_back(kZeros, next - e.at - e.length);
  }
  return out;
}

Header entry_header(const Header& h, const BatchEntry& e) {
  Header r = h;
  r.type = h.type == MsgType::sum_batch ? MsgType::sum : MsgType::push_pull;
  r.dtype = e.dtype;
  r.key = e.key;
  r.offset = e.offset;
  r.length = e.length;
  r.tensor_bytes = e.tensor_bytes;
  r.round = e.round;
  r.aux = 0;
  return r;
}

DecodedBatch decode_batch(const Header& h, std::span<const std::byte> payload, const DecodeLimits& limits) {
  const auto bad = [&](size_t i, const std::string& why) {
    return DecodedBatch{{}, std::string(msg_type_name(h.type)) + " entry " + std::to_string(i) + ": " + why};
  };
  if (h.aux == 0 || h.aux > kMaxBatchEntries || payload.size() < uint64_t{h.aux} * kBatchEntryBytes)
    return DecodedBatch{{}, std::string(msg_type_name(h.type)) + " of " + std::to_string(h.aux) + " entries in " +
                                std::to_string(payload.size()) + " bytes"};
  std::vector<BatchEntry> es(h.aux);
  for (size_t i = 0; i < es.size(); ++i) {
    const std::span<const std::byte> p = payload.subspan(i * kBatchEntryBytes, kBatchEntryBytes);
    BatchEntry& e = es[i];
    e.key = get<uint64_t>(p, 0);
    e.offset = get<uint64_t>(p, 8);
    e.length = get<uint64_t>(p, 16);
    e.tensor_bytes = get<uint64_t>(p, 24);
    e.round = get<uint64_t>(p, 32);
    const auto dtype = get<uint8_t>(p, 40);
    if (!is_valid_dtype(dtype)) return bad(i, "unknown dtype " + std::to_string(dtype) + " for key " + std::to_string(e.key));
    for (size_t b = 41; b < kBatchEntryBytes; ++b)
      if (p[b] != std::byte{0}) return bad(i, "reserved bytes not zero");
    e.dtype = static_cast<DType>(dtype);
    if (auto why = check_range(entry_header(h, e), limits); !why.empty()) return bad(i, why);
  }
  // Compared before adding, so neither the sum nor the layout below can wrap.
  uint64_t total = 0;
  for (size_t i = 0; i < es.size(); ++i) {
    if (es[i].length > payload.size() - total) return bad(i, "the entries' bytes exceed the payload");
    total += es[i].length;
  }
  if (const uint64_t want = batch_layout(es); want != payload.size())
    return DecodedBatch{{}, std::string(msg_type_name(h.type)) + " carries " + std::to_string(payload.size()) +
                                " bytes, its table lays out " + std::to_string(want)};
  return DecodedBatch{std::move(es), {}};
}

}  // namespace commsched::ps
