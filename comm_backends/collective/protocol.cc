#include "comm_backends/collective/protocol.h"

#include <sstream>
#include <stdexcept>

#include "comm_backends/collective/wire.h"

namespace commsched::collective {
namespace {

void put_desc(ByteWriter& w, const PartitionDesc& d) {
  w.put(d.key);
  w.put(d.offset);
  w.put(d.bytes);
  w.put(d.task_bytes);
  w.put(static_cast<uint8_t>(d.dtype));
  w.put(static_cast<uint8_t>(d.op));
  w.put(d.root);
}

PartitionDesc get_desc(ByteReader& r) {
  PartitionDesc d;
  d.key = r.get<uint64_t>();
  d.offset = r.get<uint64_t>();
  d.bytes = r.get<uint64_t>();
  d.task_bytes = r.get<uint64_t>();
  const auto dtype = r.get<uint8_t>();
  const auto op = r.get<uint8_t>();
  d.root = r.get<int32_t>();
  if (!is_valid_dtype(dtype)) throw std::runtime_error("negotiation message: invalid dtype value " + std::to_string(dtype));
  if (op > static_cast<uint8_t>(Op::broadcast)) throw std::runtime_error("negotiation message: invalid op value " + std::to_string(op));
  d.dtype = static_cast<DType>(dtype);
  d.op = static_cast<Op>(op);
  return d;
}

// Bounds a count read from the wire by the bytes left in the frame (each item takes at least `min_item_bytes`), so a
// few hostile bytes cannot make us allocate millions of items before the reads fail (found by tests/fuzz).
uint32_t get_count(ByteReader& r, const char* what, size_t min_item_bytes) {
  const uint32_t n = r.get<uint32_t>();
  if (n > r.remaining() / min_item_bytes)
    throw std::runtime_error(std::string("negotiation message: ") + what + " count " + std::to_string(n) +
                             " does not fit in the " + std::to_string(r.remaining()) + " bytes left");
  return n;
}

constexpr size_t kDescBytes = 4 * 8 + 1 + 1 + 4;

}  // namespace

std::string encode_hello(int rank, int size) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(MsgType::hello));
  w.put<int32_t>(rank);
  w.put<int32_t>(size);
  return w.take_frame();
}

std::string encode_simple(MsgType t) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(t));
  return w.take_frame();
}

std::string encode_ready(const std::vector<ReadyReport>& reports) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(MsgType::ready));
  w.put<uint32_t>(static_cast<uint32_t>(reports.size()));
  for (const auto& rep : reports) {
    const bool cached = rep.cache_id != kNoCacheId;
    w.put<uint8_t>(cached);
    w.put(rep.round);
    w.put(rep.priority);
    if (cached) {
      w.put(rep.cache_id);
    } else {
      put_desc(w, rep.desc);
      w.put_string(rep.name);
    }
  }
  return w.take_frame();
}

std::vector<ReadyReport> decode_ready(ByteReader& r) {
  std::vector<ReadyReport> out(get_count(r, "report", 1 + 8 + 4 + 4));
  for (auto& rep : out) {
    const bool cached = r.get<uint8_t>() != 0;
    rep.round = r.get<uint64_t>();
    rep.priority = r.get<int32_t>();
    if (cached) {
      rep.cache_id = r.get<uint32_t>();
    } else {
      rep.desc = get_desc(r);
      rep.name = r.get_string();
    }
  }
  return out;
}

std::string encode_order(const OrderMsg& m) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(MsgType::order));
  w.put<uint32_t>(static_cast<uint32_t>(m.defines.size()));
  for (const auto& d : m.defines) {
    w.put(d.cache_id);
    put_desc(w, d.desc);
  }
  w.put<uint32_t>(static_cast<uint32_t>(m.groups.size()));
  for (const auto& g : m.groups) {
    w.put<uint32_t>(static_cast<uint32_t>(g.size()));
    for (const auto& e : g) {
      w.put(e.cache_id);
      w.put(e.round);
    }
  }
  return w.take_frame();
}

OrderMsg decode_order(ByteReader& r) {
  OrderMsg m;
  m.defines.resize(get_count(r, "cache define", 4 + kDescBytes));
  for (auto& d : m.defines) {
    d.cache_id = r.get<uint32_t>();
    d.desc = get_desc(r);
  }
  m.groups.resize(get_count(r, "group", 4));
  for (auto& g : m.groups) {
    g.resize(get_count(r, "group member", 4 + 8));
    for (auto& e : g) {
      e.cache_id = r.get<uint32_t>();
      e.round = r.get<uint64_t>();
    }
  }
  return m;
}

std::string encode_error(const ErrorMsg& e) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(MsgType::error));
  w.put(e.key);
  w.put(e.offset);
  w.put(e.round);
  w.put(static_cast<uint8_t>(e.code));
  w.put_string(e.message);
  return w.take_frame();
}

ErrorMsg decode_error(ByteReader& r) {
  ErrorMsg e;
  e.key = r.get<uint64_t>();
  e.offset = r.get<uint64_t>();
  e.round = r.get<uint64_t>();
  const auto code = r.get<uint8_t>();
  if (code > static_cast<uint8_t>(Status::Code::invalid)) throw std::runtime_error("negotiation message: invalid status code");
  e.code = static_cast<Status::Code>(code);
  e.message = r.get_string();
  return e;
}

std::string encode_peer_lost(int rank, const std::string& message) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(MsgType::peer_lost));
  w.put<int32_t>(rank);
  w.put_string(message);
  return w.take_frame();
}

std::string encode_joined(int last_rank) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(MsgType::joined));
  w.put<int32_t>(last_rank);
  return w.take_frame();
}

std::string encode_lags(const std::string& text) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(MsgType::lags));
  w.put_string(text);
  return w.take_frame();
}

std::string encode_mark(const IterationMark& m) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(MsgType::mark));
  w.put<uint8_t>(m.backward);
  w.put(m.after);
  return w.take_frame();
}

IterationMark decode_mark(ByteReader& r) {
  IterationMark m;
  const auto backward = r.get<uint8_t>();
  if (backward > 1) throw std::runtime_error("negotiation message: invalid mark kind " + std::to_string(backward));
  m.backward = backward == 1;
  m.after = r.get<uint64_t>();
  return m;
}

MsgType read_type(ByteReader& r) {
  const auto t = r.get<uint8_t>();
  if (t < static_cast<uint8_t>(MsgType::hello) || t > static_cast<uint8_t>(MsgType::mark))
    throw std::runtime_error("negotiation message: unknown type " + std::to_string(t));
  return static_cast<MsgType>(t);
}

}  // namespace commsched::collective
